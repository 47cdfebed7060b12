package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Key is the stable identity of one delivery: (tenant, envelope id, segment
// index). Providers pass it to the service's idempotency mechanism where one
// exists, so a redelivery under the same key is recognised by the service.
type Key struct {
	Tenant     string `json:"tenant_id"`
	EnvelopeID string `json:"id"`
	Segment    int    `json:"segment"`
}

// String returns "tenant/id#segment". It contains application ids: do not
// log it (logs carry only stable classes and low-cardinality labels).
func (k Key) String() string {
	return k.Tenant + "/" + k.EnvelopeID + "#" + strconv.Itoa(k.Segment)
}

// Hash returns a fixed-length, opaque hex digest of the key (64 chars),
// suitable as a file name, an idempotency key or a push Topic seed. It
// reveals nothing of the ids.
func (k Key) Hash() string {
	h := sha256.New()
	h.Write([]byte(k.Tenant))
	h.Write([]byte{0})
	h.Write([]byte(k.EnvelopeID))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(k.Segment)))
	return hex.EncodeToString(h.Sum(nil))
}

// IdempotencyKey returns the key sent to a provider's idempotency mechanism:
// "outbox/" + Hash(), 71 chars, within Resend's 256-char limit.
func (k Key) IdempotencyKey() string { return "outbox/" + k.Hash() }
