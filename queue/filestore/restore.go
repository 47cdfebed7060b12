package filestore

import (
	"context"
	"encoding/json"

	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// restoreBatch bounds the envelopes AfterRestore changes in one
// transaction.
const restoreBatch = 5000

// AfterRestore makes a data directory restored from a backup (a copy of
// the whole directory, put back) safe to serve: every delivery that was
// still to deliver when the copy was taken (pending, sending, retryable)
// may have gone out since, so it becomes unresolved (queue.Restored:
// never redelivered automatically; outbox resolve and requeue decide).
// Rows that had ended stay as they were, and the records of envelopes
// pruned before the copy stay pruned, which a rebuild cannot do. Run it
// on a store no serve has open. An interrupted run is run again. It
// returns the envelopes changed.
func (q *Queue) AfterRestore(ctx context.Context) (int, error) {
	var keys [][]byte
	err := q.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktEnv).ForEach(func(k, v []byte) error {
			var e envRec
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			for seg := 0; seg < e.Segs; seg++ {
				if r, err := getRow(tx, rowKey(k, seg)); err != nil {
					return err
				} else if r != nil && !r.State.Terminal() { // queue.Restored decides
					keys = append(keys, append([]byte(nil), k...))
					return nil
				}
			}
			return nil
		})
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for len(keys) > 0 {
		batch := keys[:min(restoreBatch, len(keys))]
		keys = keys[len(batch):]
		changed := 0
		err := q.write(ctx, false, func(tx *bolt.Tx) error {
			changed = 0
			now := q.opts.Now()
			for _, ek := range batch {
				e, err := getEnv(tx, ek)
				if err != nil || e == nil {
					return err
				}
				st, err := q.step(tx, ek, e, now, func(rows []queue.Delivery) (*queue.Step, error) { return queue.Restored(rows, now) })
				if err != nil {
					return err
				}
				if len(st.Changed) > 0 {
					changed++
				}
			}
			return nil
		})
		if err != nil {
			return n, err
		}
		n += changed
	}
	return n, nil
}
