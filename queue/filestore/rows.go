package filestore

import (
	"fmt"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// The file store keeps a row's Delivery in its rowRec encoding (the index's
// format); every change goes through the state machine (machine.go) and
// is written by apply.

func toDelivery(r *rowRec) queue.Delivery {
	return queue.Delivery{
		State: r.State, Attempts: r.Attempts, Budget: r.Base, Class: r.Class, Receipt: r.Receipt,
		Due: fromNano(r.Due), Owner: r.Owner, Fence: r.Fence, LeaseEnd: fromNano(r.LeaseEnd),
		From: r.Prev, ToPending: r.ToPending, Updated: fromNano(r.Updated), History: r.History,
	}
}

func fromDelivery(d *queue.Delivery) rowRec {
	return rowRec{
		State: d.State, Attempts: d.Attempts, Base: d.Budget, Class: d.Class, Receipt: d.Receipt,
		Due: nano(d.Due), Owner: d.Owner, Fence: d.Fence, LeaseEnd: nano(d.LeaseEnd),
		Prev: d.From, ToPending: d.ToPending, Updated: nano(d.Updated), History: d.History,
	}
}

// loadRows reads every row of envelope ek.
func loadRows(tx *bolt.Tx, ek []byte, e *envRec) ([]rowRec, []queue.Delivery, error) {
	recs := make([]rowRec, e.Segs)
	ds := make([]queue.Delivery, e.Segs)
	for seg := range recs {
		r, err := getRow(tx, rowKey(ek, seg))
		if err != nil {
			return nil, nil, err
		}
		if r == nil {
			return nil, nil, fmt.Errorf("queue: the index lacks segment %d of an envelope (run \"outbox doctor\")", seg)
		}
		recs[seg] = *r
		ds[seg] = toDelivery(r)
	}
	return recs, ds, nil
}

// apply writes a state machine step on envelope ek: the changed rows (with
// their index entries and counts) and the suppressions it asks for (the
// user's, and the tenant's of the address).
func (q *Queue) apply(tx *bolt.Tx, ek []byte, e *envRec, recs []rowRec, st *queue.Step, now time.Time) error {
	tenant, _ := splitEnvKey(ek)
	// Read what the suppression needs before writing anything: an error
	// must leave the transaction as it was (other ops commit with it).
	var c queue.Consent
	var env *envelope.Envelope
	if st.Suppress != "" {
		var err error
		if env, err = q.readEnvelope(ek, e); err != nil {
			return err
		}
		if c, _, err = getConsent(tx, tenant, e.User); err != nil {
			return err
		}
	}
	for _, seg := range st.Changed {
		old := recs[seg]
		nr := fromDelivery(&st.Rows[seg])
		if err := q.putRow(tx, ek, seg, e, tenant, &old, &nr); err != nil {
			return err
		}
		recs[seg] = nr
	}
	if env == nil {
		return nil
	}
	c.Add(queue.SuppressionFor(env, st.Suppress, now))
	c.UpdatedAt = now
	if err := q.record(tx, jrec{Op: jConsent, Tenant: tenant, User: e.User, Consent: &c}); err != nil {
		return err
	}
	if a, ok := st.AddressSuppression(env, now); ok {
		return q.putAddressSup(tx, tenant, a)
	}
	return nil
}

// step loads envelope ek's rows, runs f on them and applies the result.
func (q *Queue) step(tx *bolt.Tx, ek []byte, e *envRec, now time.Time, f func([]queue.Delivery) (*queue.Step, error)) (*queue.Step, error) {
	recs, ds, err := loadRows(tx, ek, e)
	if err != nil {
		return nil, err
	}
	st, err := f(ds)
	if err != nil {
		return nil, err
	}
	return st, q.apply(tx, ek, e, recs, st, now)
}
