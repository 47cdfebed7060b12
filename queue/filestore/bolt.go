package filestore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// The bbolt layout (one file, <data>/index.db):
//
//	meta     "version" → 1, "fence" → uint64, "seq" → uint64
//	logs     log path (relative) → read offset (uint64)
//	env      tenant 0 id → envRec (JSON)
//	rows     tenant 0 id 0 segment(u32) → rowRec (JSON)
//	due/     one sub-bucket per "tenant 0 channel": due(u64 ns) seq(u64) segment(u32) → env key
//	leases   lease end(u64 ns) row key → nil
//	users    tenant 0 user 0 id → nil
//	order    seq(u64) → env key
//	consent  tenant 0 user → Consent (JSON)
//	addrsup  tenant 0 address target → Suppression (JSON), see subs.go
//	subs     tenant 0 user 0 endpoint target → Subscription (JSON), see subs.go
//	skip     log path 0 offset(u64) → nil: records of a failed enqueue batch
//	pruned   log path 0 tenant 0 id → offset(u64) length(u32): records pruned, still in their log (pruned.go)
var (
	bktMeta    = []byte("meta")
	bktLogs    = []byte("logs")
	bktEnv     = []byte("env")
	bktRows    = []byte("rows")
	bktDue     = []byte("due")
	bktLeases  = []byte("leases")
	bktUsers   = []byte("users")
	bktOrder   = []byte("order")
	bktConsent = []byte("consent")
	bktSkip    = []byte("skip")

	allBuckets = [][]byte{bktMeta, bktLogs, bktEnv, bktRows, bktDue, bktLeases, bktUsers, bktOrder, bktConsent, bktSkip}

	keyVersion = []byte("version")
	keyFence   = []byte("fence")
	keySeq     = []byte("seq")
)

const layoutVersion = 1

// envRec is the index entry of one envelope.
type envRec struct {
	User     string            `json:"u"`
	Channel  envelope.Channel  `json:"c"`
	Template envelope.Template `json:"t"`
	Log      string            `json:"l"`
	Off      int64             `json:"o"`
	Len      int               `json:"n"`
	Segs     int               `json:"s"`
	Enq      int64             `json:"e"`
	Exp      int64             `json:"x,omitempty"`
	Seq      uint64            `json:"q"`
}

// rowRec is the mutable state of one delivery row.
type rowRec struct {
	State     envelope.State      `json:"s"`
	Attempts  int                 `json:"a,omitempty"`
	Owner     string              `json:"o,omitempty"`
	Fence     uint64              `json:"f,omitempty"`
	LeaseEnd  int64               `json:"le,omitempty"`
	Due       int64               `json:"d,omitempty"` // in the due index when > 0
	Class     envelope.ErrorClass `json:"c,omitempty"`
	Receipt   string              `json:"r,omitempty"`
	Updated   int64               `json:"u"`
	Prev      envelope.State      `json:"p,omitempty"`
	ToPending bool                `json:"tp,omitempty"`
	Base      int                 `json:"b,omitempty"` // attempts before the last requeue: the retry budget counts from here
	History   []queue.Attempt     `json:"h,omitempty"`
}

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func envKey(tenant, id string) []byte {
	k := make([]byte, 0, len(tenant)+1+len(id))
	k = append(k, tenant...)
	k = append(k, 0)
	return append(k, id...)
}

func rowKey(ek []byte, seg int) []byte {
	k := make([]byte, 0, len(ek)+5)
	k = append(k, ek...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint32(k, uint32(seg))
}

// splitEnvKey returns the tenant and id of an env key; a damaged key (no
// separator) gives the tenant "", which no envelope has.
func splitEnvKey(k []byte) (tenant, id string) {
	i := bytes.IndexByte(k, 0)
	if i < 0 {
		return "", string(k)
	}
	return string(k[:i]), string(k[i+1:])
}

// splitRowKey returns the env key and the segment of a row key; a damaged
// key gives the segment -1.
func splitRowKey(k []byte) ([]byte, int) {
	n := len(k) - 5
	if n < 0 || k[n] != 0 {
		return k, -1
	}
	return k[:n], int(binary.BigEndian.Uint32(k[n+1:]))
}

func dueBucketName(tenant string, ch envelope.Channel) []byte {
	return []byte(tenant + "\x00" + string(ch))
}

func dueKey(due int64, seq uint64, seg int) []byte {
	k := make([]byte, 0, 20)
	k = binary.BigEndian.AppendUint64(k, uint64(due))
	k = binary.BigEndian.AppendUint64(k, seq)
	return binary.BigEndian.AppendUint32(k, uint32(seg))
}

func leaseKey(end int64, rk []byte) []byte {
	k := make([]byte, 0, 8+len(rk))
	k = binary.BigEndian.AppendUint64(k, uint64(end))
	return append(k, rk...)
}

func userKey(tenant, user, id string) []byte {
	return []byte(tenant + "\x00" + user + "\x00" + id)
}

func consentKey(tenant, user string) []byte { return []byte(tenant + "\x00" + user) }

func nano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func nextCounter(tx *bolt.Tx, key []byte) uint64 {
	b := tx.Bucket(bktMeta)
	var v uint64
	if cur := b.Get(key); cur != nil {
		v = binary.BigEndian.Uint64(cur)
	}
	v++
	_ = b.Put(key, u64(v))
	return v
}

func getEnv(tx *bolt.Tx, ek []byte) (*envRec, error) {
	v := tx.Bucket(bktEnv).Get(ek)
	if v == nil {
		return nil, nil
	}
	var e envRec
	return &e, json.Unmarshal(v, &e)
}

func putEnv(tx *bolt.Tx, ek []byte, e *envRec) error {
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return tx.Bucket(bktEnv).Put(ek, v)
}

func getRow(tx *bolt.Tx, rk []byte) (*rowRec, error) {
	v := tx.Bucket(bktRows).Get(rk)
	if v == nil {
		return nil, nil
	}
	var r rowRec
	return &r, json.Unmarshal(v, &r)
}

// putRow stores r and keeps the due and lease indexes in step with it: old
// is the row as it was (nil for a new row).
func putRow(tx *bolt.Tx, ek []byte, seg int, e *envRec, tenant string, old, r *rowRec) error {
	rk := rowKey(ek, seg)
	if old != nil {
		if old.Due > 0 {
			if b := tx.Bucket(bktDue).Bucket(dueBucketName(tenant, e.Channel)); b != nil {
				if err := b.Delete(dueKey(old.Due, e.Seq, seg)); err != nil {
					return err
				}
			}
		}
		if old.State == envelope.StateSending && old.LeaseEnd > 0 {
			if err := tx.Bucket(bktLeases).Delete(leaseKey(old.LeaseEnd, rk)); err != nil {
				return err
			}
		}
	}
	if r.Due > 0 {
		b, err := tx.Bucket(bktDue).CreateBucketIfNotExists(dueBucketName(tenant, e.Channel))
		if err != nil {
			return err
		}
		if err := b.Put(dueKey(r.Due, e.Seq, seg), ek); err != nil {
			return err
		}
	}
	if r.State == envelope.StateSending && r.LeaseEnd > 0 {
		if err := tx.Bucket(bktLeases).Put(leaseKey(r.LeaseEnd, rk), nil); err != nil {
			return err
		}
	}
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return tx.Bucket(bktRows).Put(rk, v)
}

func getConsent(tx *bolt.Tx, tenant, user string) (queue.Consent, bool, error) {
	v := tx.Bucket(bktConsent).Get(consentKey(tenant, user))
	if v == nil {
		return queue.Consent{}, false, nil
	}
	var c queue.Consent
	return c, true, json.Unmarshal(v, &c)
}

func putConsent(tx *bolt.Tx, tenant, user string, c queue.Consent) error {
	v, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return tx.Bucket(bktConsent).Put(consentKey(tenant, user), v)
}
