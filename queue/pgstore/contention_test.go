package pgstore_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// ledger records every lease handed out and how it ended, with a logical
// clock (tick) to order events of different goroutines.
type ledger struct {
	clock  atomic.Int64
	mu     sync.Mutex
	leases map[uint64]*leaseRec // by fence
	dupFen int                  // fences handed out twice
}

type leaseRec struct {
	key         envelope.Key
	fence       uint64
	recovered   bool
	returned    int64  // tick after Claim/Recover returned it
	end         string // "" (abandoned), sent, retry, release, failed
	commitStart int64  // tick before the successful commit began
}

func (g *ledger) tick() int64 { return g.clock.Add(1) }

func (g *ledger) took(ls []*queue.Lease, recovered bool) []*leaseRec {
	at := g.tick()
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*leaseRec, len(ls))
	for i, l := range ls {
		if _, ok := g.leases[l.Fence]; ok {
			g.dupFen++
		}
		r := &leaseRec{key: l.Key, fence: l.Fence, recovered: recovered, returned: at}
		g.leases[l.Fence] = r
		out[i] = r
	}
	return out
}

func (g *ledger) ended(r *leaseRec, end string, start int64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		r.end = "failed"
		return
	}
	r.end, r.commitStart = end, start
}

// TestContention runs 8 claimers on two stores (two pools: stand-ins for
// two processes) and a reconciler on one schema, with leases that are
// abandoned, released and retried, until every row is sent; then checks
// from the fences that no row was ever leased to two holders, that chat
// segments went strictly in order and that each row completed once.
// OUTBOX_PG_CONTENTION=20s keeps enqueueing for that long (make pg-contention).
func TestContention(t *testing.T) {
	dur := time.Duration(0)
	if v := os.Getenv("OUTBOX_PG_CONTENTION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("OUTBOX_PG_CONTENTION=%q: %v", v, err)
		}
		dur = d
	}
	ctx := context.Background()
	schema := pgtest.Schema(t)
	open := func() *pgstore.Store {
		s, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, Options: queue.Options{
			Logger:  slog.New(slog.DiscardHandler),
			Backoff: queue.Backoff{NoJitter: true, Base: time.Millisecond},
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	stores := []*pgstore.Store{open(), open()}

	const lease = 500 * time.Millisecond
	var (
		rows     atomic.Int64
		enqueued atomic.Int64
		segsOf   sync.Map // envelope id → segments
	)
	batch := func(wave int) {
		var envs []*envelope.Envelope
		for i := range 60 {
			id, user := fmt.Sprintf("w%d-e%d", wave, i), fmt.Sprintf("u-%d", i%7)
			text := "hi"
			if i%3 == 0 {
				text = queuetest.ReplyText(3)
			}
			envs = append(envs, queuetest.Reply(id, user, text))
		}
		res, err := stores[wave%2].Enqueue(ctx, envs...)
		if err != nil {
			t.Error(err)
			return
		}
		for _, r := range res {
			segsOf.Store(r.ID, r.Segments)
			rows.Add(int64(r.Segments))
		}
		enqueued.Add(int64(len(res)))
	}
	for w := range 5 {
		batch(w)
	}

	g := &ledger{leases: map[uint64]*leaseRec{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var errs atomic.Int64
	fail := func(err error) {
		if errs.Add(1) <= 5 {
			t.Error(err)
		}
	}
	for w := range 8 {
		s := stores[w%2]
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		owner := fmt.Sprintf("claimer-%d", w)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ls, err := s.Claim(ctx, queue.ClaimRequest{Owner: owner, Lease: lease, Limit: 1 + rng.IntN(4)})
				if err != nil {
					fail(err)
					return
				}
				if len(ls) == 0 {
					select {
					case <-s.Notify():
					case <-time.After(20 * time.Millisecond):
					case <-stop:
						return
					}
					continue
				}
				recs := g.took(ls, false)
				for i, l := range ls {
					var (
						end   string
						err   error
						start = g.tick()
					)
					switch p := rng.IntN(100); {
					case p < 4:
						continue // a crash: the lease runs out
					case p < 9:
						end, err = "release", s.Release(ctx, l)
					case p < 14:
						end = "retry"
						err = s.Commit(ctx, l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassProviderUnavailable, NoAttempt: true})
					default:
						end = "sent"
						err = s.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: owner})
					}
					g.ended(recs[i], end, start, err)
				}
			}
		})
	}
	wg.Go(func() { // the reconciler: the provider says every recovered call was accepted
		s := stores[1]
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			ls, err := s.Recover(ctx, queue.ClaimRequest{Owner: "reconciler", Lease: lease, Limit: 10})
			if err != nil {
				fail(err)
				return
			}
			recs := g.took(ls, true)
			for i, l := range ls {
				start := g.tick()
				g.ended(recs[i], "sent", start, s.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: "reconciled"}))
			}
		}
	})

	// More waves while the long run lasts, then wait for every row to be sent.
	wave := 5
	for end := time.Now().Add(dur); time.Now().Before(end) && errs.Load() == 0; wave++ {
		batch(wave)
		time.Sleep(100 * time.Millisecond)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for errs.Load() == 0 {
		c, err := stores[0].Counts(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if int64(c.Total(envelope.StateSent)) == rows.Load() {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("rows not all sent in time: %v of %d", c, rows.Load())
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	// The checks, from the ledger.
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dupFen > 0 {
		t.Errorf("%d fences handed out twice", g.dupFen)
	}
	byKey := map[envelope.Key][]*leaseRec{}
	for _, r := range g.leases {
		byKey[r.key] = append(byKey[r.key], r)
	}
	var doubles, orderViolations, completions, badCompletions int
	sentAt := map[envelope.Key]int64{}
	for k, ls := range byKey {
		slices.SortFunc(ls, func(a, b *leaseRec) int { return cmp.Compare(a.fence, b.fence) })
		if ls[0].recovered {
			doubles++
			t.Errorf("%v: first lease from Recover", k)
		}
		sent := 0
		for i, r := range ls {
			if r.end == "sent" {
				sent++
				sentAt[k] = r.commitStart
				if i != len(ls)-1 {
					badCompletions++
					t.Errorf("%v: leased again after it was sent (fence %d)", k, r.fence)
				}
			}
			if i == 0 {
				continue
			}
			prev := ls[i-1]
			switch {
			case !r.recovered && prev.end != "retry" && prev.end != "release":
				doubles++
				if doubles <= 5 {
					t.Errorf("%v: claimed (fence %d) while fence %d still held it (it ended %q)", k, r.fence, prev.fence, prev.end)
				}
			case r.recovered && prev.end != "" && prev.end != "failed":
				doubles++
				t.Errorf("%v: recovered (fence %d) after fence %d ended %q", k, r.fence, prev.fence, prev.end)
			}
		}
		if sent != 1 {
			badCompletions++
			t.Errorf("%v: %d successful sent commits, want 1", k, sent)
		}
		completions += sent
	}
	for k, ls := range byKey {
		if k.Segment == 0 {
			continue
		}
		prev := envelope.Key{Tenant: k.Tenant, EnvelopeID: k.EnvelopeID, Segment: k.Segment - 1}
		first := ls[0] // sorted above
		if at, ok := sentAt[prev]; !ok || first.returned < at {
			orderViolations++
			t.Errorf("%v: leased before segment %d was sent", k, prev.Segment)
		}
	}
	if int64(len(byKey)) != rows.Load() || int64(completions) != rows.Load() {
		t.Errorf("rows leased %d, completed %d, want %d", len(byKey), completions, rows.Load())
	}
	t.Logf("%d envelopes, %d rows, %d leases; double claims %d, order violations %d, bad completions %d",
		enqueued.Load(), rows.Load(), len(g.leases), doubles, orderViolations, badCompletions)
}
