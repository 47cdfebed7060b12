package queuetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

func testClaimOrder(t *testing.T, h Harness) {
	f := setup(t, h)
	at := func(id string, d time.Duration) *envelope.Envelope {
		e := Reply(id, "u-1", "text of "+id)
		if d > 0 {
			e.NotBefore = T0.Add(d)
		}
		return e
	}
	f.enqueue(at("A", 5*time.Minute), at("B", 0), at("C", time.Minute))
	f.enqueue(at("D", 0), at("E", 0))
	f.clock.Advance(10 * time.Minute)
	f.enqueue(at("F", 0))

	// Due time first, then enqueue order. Limit ≤ 0 means one row.
	for _, step := range []struct {
		limit int
		want  []string
	}{
		{0, []string{"B"}},
		{2, []string{"D", "E"}},
		{10, []string{"C", "A", "F"}},
		{10, nil},
	} {
		ls := f.claim(step.limit)
		got := make([]string, len(ls))
		for i, l := range ls {
			got[i] = l.Key.EnvelopeID
		}
		if len(got) != len(step.want) || (len(got) > 0 && !equal(got, step.want)) {
			t.Fatalf("Claim(limit %d) = %v, want %v", step.limit, got, step.want)
		}
	}
}

func testClaimFilters(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.grant("t2", "u-1")
	d2 := Digest("d2", "u-1")
	d2.TenantID = "t2"
	r2 := Reply("r2", "u-1", "hi")
	r2.TenantID = "t2"
	f.enqueue(Digest("d", "u-1"), Nudge("n", "u-1"), Reply("r", "u-1", "hi"), d2, r2)

	steps := []struct {
		req  queue.ClaimRequest
		want []string
	}{
		{req(10, envelope.ChannelPush), []string{key("n", 0)}},
		{queue.ClaimRequest{Tenant: dflt, Channels: []envelope.Channel{envelope.ChannelEmail, envelope.ChannelTelegram}, Owner: "w", Lease: DefaultLease, Limit: 10},
			[]string{key("d", 0), key("r", 0)}},
		{queue.ClaimRequest{Tenant: "t2", Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: DefaultLease, Limit: 10},
			[]string{"t2/r2#0"}},
		{req(10), []string{"t2/d2#0"}},
		{req(10), nil},
	}
	for i, s := range steps {
		if got := sorted(keys(f.claimReq(s.req))); len(got) != len(s.want) || (len(got) > 0 && !equal(got, sorted(s.want))) {
			t.Fatalf("step %d: Claim = %v, want %v", i, got, s.want)
		}
	}

	// Recover honours the same filters.
	f.clock.Advance(DefaultLease)
	rsteps := []struct {
		req  queue.ClaimRequest
		want []string
	}{
		{queue.ClaimRequest{Tenant: "t2", Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "rescuer", Lease: DefaultLease, Limit: 10},
			[]string{"t2/r2#0"}},
		{queue.ClaimRequest{Tenant: dflt, Channels: []envelope.Channel{envelope.ChannelEmail}, Owner: "rescuer", Lease: DefaultLease, Limit: 10},
			[]string{key("d", 0)}},
		{queue.ClaimRequest{Owner: "rescuer", Lease: DefaultLease, Limit: 10}, []string{key("n", 0), key("r", 0), "t2/d2#0"}},
	}
	for i, s := range rsteps {
		ls, err := f.s.Recover(f.ctx, s.req)
		if err != nil {
			t.Fatalf("Recover: %v", err)
		}
		if got := sorted(keys(ls)); !equal(got, sorted(s.want)) {
			t.Fatalf("recover step %d: Recover = %v, want %v", i, got, s.want)
		}
	}
}

func testClaimValidation(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("r", "u-1", "hi"))
	bad := []queue.ClaimRequest{
		{Lease: DefaultLease, Limit: 1},             // no owner
		{Owner: "w", Limit: 1},                      // no lease
		{Owner: "w", Lease: -time.Second, Limit: 1}, // negative lease
	}
	for i, r := range bad {
		if _, err := f.s.Claim(f.ctx, r); err == nil {
			t.Fatalf("Claim(%d: %+v) succeeded, want an error", i, r)
		}
		if _, err := f.s.Recover(f.ctx, r); err == nil {
			t.Fatalf("Recover(%d: %+v) succeeded, want an error", i, r)
		}
	}
	if s := f.seg(dflt, "r", 0); s.State != envelope.StatePending || s.Attempts != 0 {
		t.Fatalf("after rejected claims: %+v, want pending with no attempt", s)
	}
}

func testFences(t *testing.T, h Harness) {
	f := setup(t, h)
	var envs []*envelope.Envelope
	for i := range 8 {
		envs = append(envs, Reply(fmt.Sprintf("r-%d", i), "u-1", "hi"))
	}
	f.enqueue(envs...)

	var fences []uint64
	for _, n := range []int{1, 2, 3} {
		for _, l := range f.claim(n) {
			fences = append(fences, l.Fence)
		}
	}
	if fences[0] != 1 {
		t.Fatalf("first fence of a new store = %d, want 1", fences[0])
	}
	ls := f.claim(1)
	f.commit(ls[0], queue.Outcome{State: envelope.StateSent})
	fences = append(fences, ls[0].Fence)
	f.clock.Advance(DefaultLease)
	for _, l := range f.recover(10) {
		fences = append(fences, l.Fence)
	}
	for _, l := range f.claim(10) {
		fences = append(fences, l.Fence)
	}
	if len(fences) != 7+6+1 {
		t.Fatalf("issued %d fences, want 14", len(fences))
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences not strictly increasing: %v", fences)
		}
	}
}

// testConcurrentClaims runs on the real clock: 8 claimers race for 4000
// rows; each row must be leased exactly once.
func testConcurrentClaims(t *testing.T, h Harness) {
	f := setup(t, h, func(o *queue.Options) { o.Now = nil })
	const workers, perWorker = 8, 500
	envs := make([]*envelope.Envelope, 0, workers*perWorker)
	for i := range workers * perWorker {
		envs = append(envs, Reply(fmt.Sprintf("c-%04d", i), fmt.Sprintf("u-%d", i%37), "hi"))
	}
	f.enqueue(envs...)

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		claimed = map[string]int{}
		owners  = map[string]string{}
		errs    []error
	)
	start := make(chan struct{})
	for w := range workers {
		owner := fmt.Sprintf("worker-%d", w)
		wg.Go(func() {
			<-start
			for {
				ls, err := f.s.Claim(f.ctx, queue.ClaimRequest{Owner: owner, Lease: time.Hour, Limit: 1 + w%4})
				if err == nil {
					for _, l := range ls {
						if l.Owner != owner {
							err = fmt.Errorf("lease owner %q, want %q", l.Owner, owner)
							break
						}
						if err = f.s.Commit(f.ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: owner}); err != nil {
							break
						}
					}
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, l := range ls {
					claimed[l.Key.String()]++
					owners[l.Key.String()] = owner
				}
				mu.Unlock()
				if err != nil || len(ls) == 0 {
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent claim/commit: %v", errs[0])
	}
	if len(claimed) != workers*perWorker {
		t.Fatalf("%d rows claimed, want %d", len(claimed), workers*perWorker)
	}
	for k, n := range claimed {
		if n != 1 {
			t.Fatalf("row %s claimed %d times", k, n)
		}
	}
	if got := f.counts("").Total(envelope.StateSent); got != workers*perWorker {
		t.Fatalf("sent rows = %d, want %d", got, workers*perWorker)
	}
	for _, id := range []string{"c-0000", "c-1999", "c-3999"} {
		k := key(id, 0)
		if s := f.seg(dflt, id, 0); s.Receipt != owners[k] || s.Attempts != 1 {
			t.Fatalf("%s = %+v, want sent once by %s", k, s, owners[k])
		}
	}
}

func testCommitSent(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.enqueue(Digest("d-1", "u-1"))
	l := f.claimOne("d-1")
	f.clock.Advance(5 * time.Second)
	f.commit(l, queue.Outcome{State: envelope.StateSent, Receipt: "re_7f3a"})

	st := f.get(dflt, "d-1")
	if st.Status != queue.StatusDelivered {
		t.Fatalf("Status = %q, want delivered", st.Status)
	}
	s := st.Segments[0]
	if s.State != envelope.StateSent || s.Receipt != "re_7f3a" || s.Attempts != 1 || s.Class != "" ||
		!s.UpdatedAt.Equal(T0.Add(5*time.Second)) {
		t.Fatalf("segment = %+v, want sent with the receipt", s)
	}
	want := []queue.Attempt{{Attempt: 1, At: T0.Add(5 * time.Second), State: envelope.StateSent}}
	if !sameHistory(s.History, want) {
		t.Fatalf("history = %+v, want %+v", s.History, want)
	}
	f.noClaim("after sent")
	f.clock.Advance(time.Hour)
	f.noClaim("an hour after sent")
	if c := f.counts(dflt); c[envelope.StateSent][envelope.ChannelEmail] != 1 || c.Total(envelope.StatePending) != 0 {
		t.Fatalf("Counts = %v", c)
	}
}

func sameHistory(got, want []queue.Attempt) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Attempt != w.Attempt || !g.At.Equal(w.At) || g.State != w.State || g.Class != w.Class {
			return false
		}
	}
	return true
}

func testRetryBackoff(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("r", "u-1", "hi"))

	l := f.claimOne("r")
	f.commit(l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassTimeout})
	s := f.seg(dflt, "r", 0)
	if s.State != envelope.StateRetryable || s.Class != envelope.ClassTimeout || s.Attempts != 1 || !s.NextAt.Equal(T0.Add(time.Second)) {
		t.Fatalf("after retryable: %+v, want retryable timeout, 1 attempt, due T0+1s", s)
	}
	if want := []queue.Attempt{{Attempt: 1, At: T0, State: envelope.StateRetryable, Class: envelope.ClassTimeout}}; !sameHistory(s.History, want) {
		t.Fatalf("history = %+v, want %+v", s.History, want)
	}
	if st := f.get(dflt, "r"); st.Status != string(envelope.StateRetryable) {
		t.Fatalf("Status = %q, want retryable", st.Status)
	}
	f.noClaim("before the backoff")
	f.wantNextDue(T0.Add(time.Second))
	f.clock.Advance(999 * time.Millisecond)
	f.noClaim("1ms before the backoff")
	f.clock.Advance(time.Millisecond)
	l = f.claimOne("r")
	if l.Attempt != 2 {
		t.Fatalf("attempt = %d, want 2", l.Attempt)
	}

	// Exponential: the second failure waits 2s.
	f.commit(l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassProviderUnavailable})
	now := f.clock.Now()
	if s := f.seg(dflt, "r", 0); !s.NextAt.Equal(now.Add(2 * time.Second)) {
		t.Fatalf("second backoff due %v, want %v", s.NextAt, now.Add(2*time.Second))
	}
	f.clock.Advance(2*time.Second - time.Millisecond)
	f.noClaim("before the second backoff")
	f.clock.Advance(time.Millisecond)
	l = f.claimOne("r")

	// Retry-After longer than the backoff (4s) wins.
	f.commit(l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassRateLimited, RetryAfter: 30 * time.Second})
	now = f.clock.Now()
	if s := f.seg(dflt, "r", 0); !s.NextAt.Equal(now.Add(30 * time.Second)) {
		t.Fatalf("Retry-After due %v, want %v", s.NextAt, now.Add(30*time.Second))
	}
	f.clock.Advance(29 * time.Second)
	f.noClaim("before Retry-After")
	f.clock.Advance(time.Second)
	l = f.claimOne("r")

	// Retry-After shorter than the backoff (8s) is only a minimum.
	f.commit(l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassRateLimited, RetryAfter: time.Second})
	now = f.clock.Now()
	if s := f.seg(dflt, "r", 0); !s.NextAt.Equal(now.Add(8*time.Second)) || s.Attempts != 4 || len(s.History) != 4 {
		t.Fatalf("segment = %+v, want due in 8s after 4 attempts", s)
	}
}

func testMaxAttempts(t *testing.T, h Harness) {
	f := setup(t, h, func(o *queue.Options) { o.Backoff.MaxAttempts = 3 })
	f.enqueue(Reply("r", "u-1", "hi"))
	for i := 1; i <= 3; i++ {
		l := f.claimOne("r")
		if l.Attempt != i {
			t.Fatalf("attempt = %d, want %d", l.Attempt, i)
		}
		f.commit(l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassRateLimited})
		f.clock.Advance(time.Hour)
	}
	s := f.seg(dflt, "r", 0)
	if s.State != envelope.StateDeadLetter || s.Attempts != 3 || s.Class != envelope.ClassRateLimited {
		t.Fatalf("after 3 failures: %+v, want dead_letter, 3 attempts, class rate_limited", s)
	}
	if len(s.History) != 3 || s.History[2].State != envelope.StateDeadLetter || s.History[1].State != envelope.StateRetryable {
		t.Fatalf("history = %+v", s.History)
	}
	f.noClaim("after dead_letter")
	f.wantNextDue(time.Time{})
}

func testPermanent(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("r", "u-1", "hi"))
	f.commit(f.claimOne("r"), queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassInvalidRequest})
	s := f.seg(dflt, "r", 0)
	if s.State != envelope.StateDeadLetter || s.Attempts != 1 || s.Class != envelope.ClassInvalidRequest {
		t.Fatalf("after a permanent failure: %+v, want dead_letter after 1 attempt", s)
	}
	if st := f.get(dflt, "r"); st.Status != string(envelope.StateDeadLetter) {
		t.Fatalf("Status = %q", st.Status)
	}
	f.clock.Advance(24 * time.Hour)
	f.noClaim("a day after dead_letter")
}

func testStaleFence(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("r", "u-1", "hi"))
	l1 := f.claimOne("r")

	f.clock.Advance(DefaultLease + time.Second)
	rs := f.recover(10)
	if len(rs) != 1 {
		t.Fatalf("Recover = %v, want one lease", keys(rs))
	}
	l2 := rs[0]
	if l2.Key != l1.Key || l2.Fence <= l1.Fence || l2.Attempt != 1 || l2.Owner != "rescuer" ||
		!l2.ExpiresAt.Equal(f.clock.Now().Add(DefaultLease)) || l2.Envelope == nil {
		t.Fatalf("recovered lease = %+v (first fence %d)", l2, l1.Fence)
	}

	// The first holder comes back late: rejected, nothing changes.
	wantErr(t, f.s.Commit(f.ctx, l1, queue.Outcome{State: envelope.StateSent, Receipt: "late"}), queue.ErrStaleFence, "Commit with the expired lease")
	wantErr(t, f.s.Release(f.ctx, l1), queue.ErrStaleFence, "Release with the expired lease")
	s := f.seg(dflt, "r", 0)
	if s.State != envelope.StateSending || s.Attempts != 1 || s.Receipt != "" || len(s.History) != 0 || s.Fence != l2.Fence {
		t.Fatalf("after stale commits: %+v, want sending under fence %d", s, l2.Fence)
	}

	// Reconciliation found the call rejected: retry at once, attempt given back.
	f.commit(l2, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassReconcileRejected, NoAttempt: true})
	if s := f.seg(dflt, "r", 0); s.State != envelope.StateRetryable || s.Attempts != 0 {
		t.Fatalf("after NoAttempt retryable: %+v, want retryable with 0 attempts", s)
	}
	l3 := f.claimOne("r")
	if l3.Fence <= l2.Fence || l3.Attempt != 1 {
		t.Fatalf("re-claim = fence %d attempt %d, want fence > %d and attempt 1", l3.Fence, l3.Attempt, l2.Fence)
	}
	wantErr(t, f.s.Commit(f.ctx, l1, queue.Outcome{State: envelope.StateSent}), queue.ErrStaleFence, "Commit with the first lease")
	wantErr(t, f.s.Commit(f.ctx, l2, queue.Outcome{State: envelope.StateSent}), queue.ErrStaleFence, "Commit with the recovery lease")
	forged := *l3
	forged.Owner = "intruder"
	wantErr(t, f.s.Commit(f.ctx, &forged, queue.Outcome{State: envelope.StateSent}), queue.ErrStaleFence, "Commit with the right fence and the wrong owner")
	if s := f.seg(dflt, "r", 0); s.State != envelope.StateSending || s.Fence != l3.Fence || s.Attempts != 1 || len(s.History) != 1 {
		t.Fatalf("after rejected commits: %+v", s)
	}
	f.commit(l3, queue.Outcome{State: envelope.StateSent, Receipt: "ok"})
	if st := f.get(dflt, "r"); st.Status != queue.StatusDelivered || st.Segments[0].Receipt != "ok" {
		t.Fatalf("Get = %+v, want delivered with receipt ok", st)
	}
}

func testLeaseLost(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("a", "u-1", "hi"), Reply("b", "u-1", "hi"), Reply("c", "u-2", "hi"))

	la := f.claim(1)[0]
	f.commit(la, queue.Outcome{State: envelope.StateSent, Receipt: "first"})
	for _, out := range []queue.Outcome{
		{State: envelope.StateSent, Receipt: "second"},
		{State: envelope.StateRetryable, Class: envelope.ClassTimeout},
	} {
		wantErr(t, f.s.Commit(f.ctx, la, out), queue.ErrLeaseLost, "a second Commit of the same lease")
	}
	wantErr(t, f.s.Release(f.ctx, la), queue.ErrLeaseLost, "Release after Commit")
	if s := f.seg(dflt, "a", 0); s.State != envelope.StateSent || s.Receipt != "first" || len(s.History) != 1 {
		t.Fatalf("after repeated commits: %+v", s)
	}

	// A state a worker may not commit is rejected and changes nothing.
	lb := f.claim(1)[0]
	for _, st := range []envelope.State{envelope.StatePending, envelope.StateSending, "bogus", ""} {
		wantErr(t, f.s.Commit(f.ctx, lb, queue.Outcome{State: st}), queue.ErrInvalidTransition, fmt.Sprintf("Commit(%q)", st))
	}
	if s := f.seg(dflt, "b", 0); s.State != envelope.StateSending || s.Attempts != 1 || len(s.History) != 0 {
		t.Fatalf("after invalid commits: %+v", s)
	}
	f.commit(lb, queue.Outcome{State: envelope.StateSent})

	// A leased row that was erased: the lease is lost.
	lc := f.claim(1)[0]
	if err := f.s.Erase(f.ctx, dflt, "u-2"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, f.s.Commit(f.ctx, lc, queue.Outcome{State: envelope.StateSent}), queue.ErrLeaseLost, "Commit of an erased row")
	wantErr(t, f.s.Release(f.ctx, lc), queue.ErrLeaseLost, "Release of an erased row")
}

func testRelease(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("r", "u-1", "hi"))
	l1 := f.claimOne("r")
	f.clock.Advance(time.Second)
	if err := f.s.Release(f.ctx, l1); err != nil {
		t.Fatalf("Release: %v", err)
	}
	s := f.seg(dflt, "r", 0)
	if s.State != envelope.StatePending || s.Attempts != 0 || !s.NextAt.Equal(f.clock.Now()) {
		t.Fatalf("after Release: %+v, want pending, 0 attempts, due now", s)
	}
	wantErr(t, f.s.Commit(f.ctx, l1, queue.Outcome{State: envelope.StateSent}), queue.ErrLeaseLost, "Commit after Release")
	l2 := f.claimOne("r")
	if l2.Attempt != 1 || l2.Fence <= l1.Fence {
		t.Fatalf("re-claim: attempt %d fence %d, want attempt 1 and fence > %d", l2.Attempt, l2.Fence, l1.Fence)
	}
	wantErr(t, f.s.Release(f.ctx, l1), queue.ErrStaleFence, "Release of an old lease")

	// From retryable: back to retryable, the attempt not counted, due now.
	f.commit(l2, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassTimeout})
	f.clock.Advance(time.Second)
	l3 := f.claimOne("r")
	if l3.Attempt != 2 {
		t.Fatalf("attempt = %d, want 2", l3.Attempt)
	}
	if err := f.s.Release(f.ctx, l3); err != nil {
		t.Fatalf("Release: %v", err)
	}
	s = f.seg(dflt, "r", 0)
	if s.State != envelope.StateRetryable || s.Attempts != 1 || !s.NextAt.Equal(f.clock.Now()) {
		t.Fatalf("after Release of a retry: %+v, want retryable, 1 attempt, due now", s)
	}
	if l4 := f.claimOne("r"); l4.Attempt != 2 {
		t.Fatalf("attempt after release = %d, want 2", l4.Attempt)
	}
}

// testReleaseRecovered: a recovery lease given back (its reconciliation
// never started) leaves the row sending with its lease over, to be
// recovered again. The earlier call's fate is still unknown: the row is
// not claimable for a new delivery and its attempt is not given back.
func testReleaseRecovered(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("r", "u-1", "hi"))
	l := f.claimOne("r")
	f.clock.Advance(DefaultLease)
	rs := f.recover(10)
	if len(rs) != 1 {
		t.Fatalf("Recover = %v, want r", keys(rs))
	}
	f.clock.Advance(time.Second)
	if err := f.s.Release(f.ctx, rs[0]); err != nil {
		t.Fatalf("Release of a recovery lease: %v", err)
	}
	s := f.seg(dflt, "r", 0)
	if s.State != envelope.StateSending || s.Attempts != 1 || s.Fence != rs[0].Fence || !s.LeaseEnd.Equal(f.clock.Now()) || len(s.History) != 0 {
		t.Fatalf("after releasing the recovery lease: %+v, want sending, 1 attempt, fence %d, lease over now", s, rs[0].Fence)
	}
	f.noClaim("a row of unknown fate")
	f.wantNextDue(f.clock.Now())
	if err := f.s.Commit(f.ctx, rs[0], queue.Outcome{State: envelope.StateSent}); err == nil {
		t.Fatal("Commit of a released recovery lease succeeded")
	}
	if err := f.s.Release(f.ctx, rs[0]); err == nil {
		t.Fatal("a second Release of the recovery lease succeeded")
	}

	again := f.recover(10)
	if len(again) != 1 || again[0].Key != l.Key || again[0].Fence <= rs[0].Fence || again[0].Attempt != 1 {
		t.Fatalf("Recover after the release = %v, want r again with a newer fence, attempt 1", keys(again))
	}
	wantErr(t, f.s.Commit(f.ctx, l, queue.Outcome{State: envelope.StateSent}), queue.ErrStaleFence, "Commit by the first lease")
	f.commit(again[0], queue.Outcome{State: envelope.StateSent, Receipt: "found"})
	if s := f.seg(dflt, "r", 0); s.State != envelope.StateSent || s.Attempts != 1 || s.Receipt != "found" {
		t.Fatalf("after reconciling: %+v, want sent after 1 attempt", s)
	}
}

func testRecover(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("A", "u-1", "a"), Reply("B", "u-1", "b"), Reply("C", "u-1", "c"), Reply("D", "u-1", "d"))
	first := f.claimReq(queue.ClaimRequest{Owner: "crashed", Lease: 10 * time.Second, Limit: 10})
	if len(first) != 4 {
		t.Fatalf("Claim = %v", keys(first))
	}
	f.clock.Advance(5 * time.Second)
	if rs := f.recover(10); len(rs) != 0 {
		t.Fatalf("Recover before the leases expired = %v", keys(rs))
	}
	f.clock.Advance(5 * time.Second) // exactly at lease expiry
	rs := f.recover(2)
	if len(rs) != 2 {
		t.Fatalf("Recover(limit 2) = %v", keys(rs))
	}
	rs = append(rs, f.recover(10)...)
	got := map[string]*queue.Lease{}
	for _, l := range rs {
		if l.Attempt != 1 || l.Owner != "rescuer" || !l.ExpiresAt.Equal(f.clock.Now().Add(DefaultLease)) {
			t.Fatalf("recovered lease %+v, want attempt 1, owner rescuer, new expiry", l)
		}
		got[l.Key.EnvelopeID] = l
	}
	if len(got) != 4 {
		t.Fatalf("recovered %v, want A B C D once each", keys(rs))
	}
	if more := f.recover(10); len(more) != 0 {
		t.Fatalf("Recover while recovery leases hold = %v", keys(more))
	}
	f.noClaim("while rows are being reconciled")

	f.commit(got["A"], queue.Outcome{State: envelope.StateSent, Receipt: "found"})
	f.commit(got["B"], queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassReconcileRejected, NoAttempt: true})
	f.commit(got["C"], queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown})
	// D's rescuer dies too: its recovery lease expires and D is recovered again.
	f.wantState(dflt, "A", 0, envelope.StateSent, "")
	f.wantState(dflt, "C", 0, envelope.StateUnresolved, envelope.ClassReconcileUnknown)
	if s := f.seg(dflt, "B", 0); s.State != envelope.StateRetryable || s.Attempts != 0 {
		t.Fatalf("B = %+v, want retryable with the attempt given back", s)
	}
	lb := f.claimOne("B")
	if lb.Attempt != 1 {
		t.Fatalf("B attempt = %d, want 1", lb.Attempt)
	}
	f.commit(lb, queue.Outcome{State: envelope.StateSent})

	f.clock.Advance(DefaultLease)
	again := f.recover(10)
	if len(again) != 1 || again[0].Key.EnvelopeID != "D" || again[0].Fence <= got["D"].Fence || again[0].Attempt != 1 {
		t.Fatalf("second Recover = %v, want D with a newer fence", keys(again))
	}
	wantErr(t, f.s.Commit(f.ctx, got["D"], queue.Outcome{State: envelope.StateSent}), queue.ErrStaleFence, "Commit by the first rescuer")
	f.commit(again[0], queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown})

	// Unresolved rows are never delivered again by themselves.
	f.clock.Advance(30 * 24 * time.Hour)
	f.noClaim("unresolved rows a month later")
	if rs := f.recover(10); len(rs) != 0 {
		t.Fatalf("Recover of unresolved rows = %v", keys(rs))
	}
	f.wantNextDue(time.Time{})
	if c := f.counts(dflt); c[envelope.StateUnresolved][envelope.ChannelTelegram] != 2 {
		t.Fatalf("Counts = %v, want 2 unresolved", c)
	}

	// Only an operator brings them back.
	if err := f.s.Resolve(f.ctx, dflt, "C", envelope.StateRetryable); err != nil {
		t.Fatal(err)
	}
	if lc := f.claimOne("C"); lc.Attempt != 2 {
		t.Fatalf("C attempt after resolve = %d, want 2", lc.Attempt)
	}
	if err := f.s.Requeue(f.ctx, dflt, "D"); err != nil {
		t.Fatal(err)
	}
	f.claimOne("D")
}

func testExpireToPending(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("ext", "u-1", "hi"), Reply("own", "u-1", "hi"))
	ext := f.claimReq(queue.ClaimRequest{Owner: "external", Lease: 10 * time.Second, Limit: 1, ExpireToPending: true})
	own := f.claimReq(queue.ClaimRequest{Owner: "worker", Lease: 10 * time.Second, Limit: 1})
	if len(ext) != 1 || len(own) != 1 || ext[0].Key.EnvelopeID != "ext" {
		t.Fatalf("claims = %v %v", keys(ext), keys(own))
	}
	f.clock.Advance(10 * time.Second)
	rs := f.recover(10)
	if len(rs) != 1 || rs[0].Key.EnvelopeID != "own" {
		t.Fatalf("Recover = %v, want only the ordinary lease", keys(rs))
	}
	s := f.seg(dflt, "ext", 0)
	if s.State != envelope.StatePending || s.Attempts != 1 || !s.NextAt.Equal(f.clock.Now()) {
		t.Fatalf("expired ExpireToPending lease: %+v, want pending, attempt kept, due now", s)
	}
	l := f.claimOne("ext")
	if l.Attempt != 2 || l.Fence <= ext[0].Fence {
		t.Fatalf("re-claim attempt %d fence %d", l.Attempt, l.Fence)
	}
	wantErr(t, f.s.Commit(f.ctx, ext[0], queue.Outcome{State: envelope.StateSent}), queue.ErrStaleFence, "Commit of the expired external lease")
	f.commit(l, queue.Outcome{State: envelope.StateSent})
}
