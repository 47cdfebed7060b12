package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

type commitReq struct {
	lease *queue.Lease
	out   queue.Outcome
}

// Concurrent Commit calls share one transaction, each still all or
// nothing: a commit the state machine refuses fails alone, a commit whose
// envelope another transaction holds or another commit of the group has
// already goes alone after the group, the suppression a commit writes goes
// with it, and when the server refuses the group's statement every commit
// is tried alone.
func TestCommit_GroupCommit(t *testing.T) {
	ctx := context.Background()
	s, schema, waiting, groups := hookedStore(t, pgstore.SetCommitHooks)
	tbl := pgx.Identifier{schema}.Sanitize()

	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for _, id := range ids {
		if _, err := s.Enqueue(ctx, queuetest.Reply(id, "u-"+id, "hi")); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := s.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Hour, Limit: len(ids)})
	if err != nil || len(ls) != len(ids) {
		t.Fatalf("Claim = %d leases, %v", len(ls), err)
	}
	lease := map[string]*queue.Lease{}
	for _, l := range ls {
		lease[l.Key.EnvelopeID] = l
	}
	lock := func(id string) pgx.Tx {
		t.Helper()
		tx, err := pgtest.Admin().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM `+tbl+`.envelopes WHERE id = $1 FOR UPDATE`, id); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	sent := queue.Outcome{State: envelope.StateSent}

	// round commits first alone while the admin holds its envelope, so
	// that the calls started meanwhile (in order) wait and then run as one
	// group; then meanwhile runs.
	round := func(first *queue.Lease, meanwhile func(), calls ...commitReq) []error {
		t.Helper()
		tx := lock(first.Key.EnvelopeID)
		defer tx.Rollback(ctx)
		blocked := make(chan error, 1)
		go func() { blocked <- s.Commit(ctx, first, sent) }()
		if n := <-groups; n != 1 {
			t.Fatalf("the first commit ran in a group of %d", n)
		}
		waitBlocked(t, schema)
		out := make([]error, len(calls))
		done := make(chan struct{}, len(calls))
		for i, c := range calls {
			go func() {
				out[i] = s.Commit(ctx, c.lease, c.out)
				done <- struct{}{}
			}()
			<-waiting
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-blocked; err != nil {
			t.Fatalf("the first commit: %v", err)
		}
		if n := <-groups; n != len(calls) {
			t.Fatalf("the waiting commits ran in a group of %d, want %d", n, len(calls))
		}
		meanwhile()
		for range calls {
			<-done
		}
		return out
	}

	stale := *lease["c"]
	stale.Owner = "another worker"
	again := *lease["b"]
	held := lock("d")
	defer held.Rollback(ctx)
	r := round(lease["a"], func() {
		// d's envelope was held: it goes alone after the group, and
		// waits for the admin.
		waitBlocked(t, schema)
		if err := held.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	},
		commitReq{lease["b"], queue.Outcome{State: envelope.StateSent, Receipt: "rb"}},
		commitReq{&stale, sent},
		commitReq{lease["d"], sent},
		commitReq{lease["e"], queue.Outcome{State: envelope.StateSuppressed, Class: envelope.ClassBlockedByUser}},
		commitReq{&again, sent},
	)
	for i, want := range []error{nil, queue.ErrStaleFence, nil, nil, queue.ErrLeaseLost} {
		if !errors.Is(r[i], want) || (want == nil && r[i] != nil) {
			t.Errorf("commit %d = %v, want %v", i, r[i], want)
		}
	}
	state := func(id string) (envelope.State, string) {
		t.Helper()
		st, err := s.Get(ctx, "", id)
		if err != nil {
			t.Fatal(err)
		}
		return st.Segments[0].State, st.Segments[0].Receipt
	}
	for id, want := range map[string]envelope.State{"a": envelope.StateSent, "b": envelope.StateSent, "c": envelope.StateSending,
		"d": envelope.StateSent, "e": envelope.StateSuppressed} {
		if got, _ := state(id); got != want {
			t.Errorf("%s is %s, want %s", id, got, want)
		}
	}
	if _, rc := state("b"); rc != "rb" {
		t.Errorf("b's receipt = %q, want rb", rc)
	}
	if c, err := s.Consent(ctx, "", "u-e"); err != nil || len(c.Suppressions) != 1 || c.Suppressions[0].Channel != envelope.ChannelTelegram {
		t.Errorf("u-e's consent = %+v, %v; want the telegram suppression of e's commit", c, err)
	}

	// The server refuses one commit's row: the group's statement fails,
	// and each commit is tried alone.
	if _, err := pgtest.Admin().Exec(ctx, `ALTER TABLE `+tbl+`.deliveries ADD CONSTRAINT poison CHECK (receipt <> 'poison')`); err != nil {
		t.Fatal(err)
	}
	r = round(lease["f"], func() {},
		commitReq{lease["g"], queue.Outcome{State: envelope.StateSent, Receipt: "poison"}},
		commitReq{lease["h"], sent},
	)
	if r[0] == nil || !containsAll(r[0].Error(), "commit", "poison") {
		t.Errorf("the refused commit = %v, want the server's refusal", r[0])
	}
	if r[1] != nil {
		t.Errorf("the other commit = %v, want nil", r[1])
	}
	for id, want := range map[string]envelope.State{"f": envelope.StateSent, "g": envelope.StateSending, "h": envelope.StateSent} {
		if got, _ := state(id); got != want {
			t.Errorf("%s is %s, want %s", id, got, want)
		}
	}
}
