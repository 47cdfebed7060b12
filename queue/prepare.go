package queue

import (
	"fmt"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// Prepared is one envelope of an Enqueue call, checked: a private copy
// with its tenant set, its JSON encoding and the rows it materialises.
type Prepared struct {
	Env      *envelope.Envelope
	Line     []byte // the envelope's JSON encoding
	Segments int    // envelope.Rows
}

// Admit is the rule a store applies to each new envelope of an Enqueue
// call, once it knows the envelope is not a duplicate (idempotency first:
// a stored envelope is a duplicate whatever consent or the clock say now)
// and has looked up current consent: what a claim at now would decide
// (Judge). An envelope past its expires_at is refused with ErrExpired, one
// that consent forbids with ErrConsentDenied; i is its index in the call.
func Admit(i int, e *envelope.Envelope, c Consent, found bool, addr *Suppression, now time.Time) error {
	switch v := Judge(e, c, found, addr, now); v.State {
	case envelope.StateExpired:
		return &EnqueueError{Index: i, Tenant: e.TenantID, ID: e.ID, Reason: v.Class,
			Err: fmt.Errorf("%w (%s, now %s)", ErrExpired, e.ExpiresAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))}
	case envelope.StateSuppressed:
		return &EnqueueError{Index: i, Tenant: e.TenantID, ID: e.ID, Reason: v.Class, Err: ErrConsentDenied}
	}
	return nil
}

// Prepare checks every envelope of an Enqueue call, in order, as every
// store does before it looks anything up: the first one missing or invalid
// fails the call with an *EnqueueError wrapping envelope.ErrInvalid.
func Prepare(envs []*envelope.Envelope) ([]Prepared, error) {
	out := make([]Prepared, len(envs))
	for i, in := range envs {
		if in == nil {
			return nil, &EnqueueError{Index: i, Err: fmt.Errorf("nil envelope: %w", envelope.ErrInvalid)}
		}
		e := in.Clone()
		e.TenantID = in.Tenant()
		line, segs, err := envelope.ValidEncodingRows(e)
		if err != nil {
			return nil, &EnqueueError{Index: i, Tenant: e.TenantID, ID: e.ID, Err: err}
		}
		out[i] = Prepared{Env: e, Line: line, Segments: segs}
	}
	return out, nil
}
