package filestore

import (
	"context"
	"encoding/json"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// Row counts by tenant, state and channel are kept in memory, so that
// Counts (outbox stats, the queue_depth gauge) costs nothing with a large
// queue: the first Counts scans the rows once, inside the writer, and from
// then on every committed transaction applies the changes its rows made.

type countKey struct {
	tenant  string
	state   envelope.State
	channel envelope.Channel
}

// putRow is putRow that also records the change of counts for the
// transaction the writer is running (only the writer goroutine calls it).
func (q *Queue) putRow(tx *bolt.Tx, ek []byte, seg int, e *envRec, tenant string, old, r *rowRec) error {
	if err := putRow(tx, ek, seg, e, tenant, old, r); err != nil {
		return err
	}
	if q.txDelta != nil {
		if old != nil && old.State != "" {
			q.txDelta[countKey{tenant, old.State, e.Channel}]--
		}
		if r.State != "" {
			q.txDelta[countKey{tenant, r.State, e.Channel}]++
		}
	}
	return nil
}

// applyDelta folds a committed transaction's changes into the counts.
func (q *Queue) applyDelta(d map[countKey]int) {
	if len(d) == 0 {
		return
	}
	q.cmu.Lock()
	defer q.cmu.Unlock()
	if q.counts == nil {
		return
	}
	for k, v := range d {
		if n := q.counts[k] + v; n != 0 {
			q.counts[k] = n
		} else {
			delete(q.counts, k)
		}
	}
}

// Counts implements Store.
func (q *Queue) Counts(ctx context.Context, tenant string) (queue.Counts, error) {
	if q.isClosed() {
		return nil, queue.ErrClosed
	}
	q.cmu.Lock()
	ready := q.counts != nil
	q.cmu.Unlock()
	if !ready {
		// Scan once, inside the writer, so that no transaction's changes
		// fall between the scan and the first delta.
		err := q.write(ctx, true, func(tx *bolt.Tx) error {
			c, err := scanCounts(tx)
			if err != nil {
				return err
			}
			q.cmu.Lock()
			q.counts = c
			q.cmu.Unlock()
			// The scan already holds what this transaction's earlier ops
			// wrote; only later ops' changes are still to be applied.
			q.txDelta = map[countKey]int{}
			return nil
		})
		if err != nil {
			return nil, err
		}
	} else {
		q.barrier()
	}
	out := queue.Counts{}
	q.cmu.Lock()
	defer q.cmu.Unlock()
	for k, n := range q.counts {
		if tenant != "" && k.tenant != tenant {
			continue
		}
		if out[k.state] == nil {
			out[k.state] = map[envelope.Channel]int{}
		}
		out[k.state][k.channel] += n
	}
	return out, nil
}

// scanCounts counts every row (by tenant, state and channel).
func scanCounts(tx *bolt.Tx) (map[countKey]int, error) {
	out := map[countKey]int{}
	envs := tx.Bucket(bktEnv)
	chans := map[string]envelope.Channel{}
	err := tx.Bucket(bktRows).ForEach(func(k, v []byte) error {
		ek, _ := splitRowKey(k)
		t, _ := splitEnvKey(ek)
		ch, ok := chans[string(ek)]
		if !ok {
			var e envRec
			if raw := envs.Get(ek); raw != nil {
				if err := json.Unmarshal(raw, &e); err != nil {
					return err
				}
			}
			ch = e.Channel
			if len(chans) < 4096 {
				chans[string(ek)] = ch
			}
		}
		var r rowRec
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		out[countKey{t, r.State, ch}]++
		return nil
	})
	return out, err
}
