package queuetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

func testCrossTenant(t *testing.T, h Harness) {
	f := setup(t, h)
	a, b := queue.Scope(f.s, "tenant-a"), queue.Scope(f.s, "tenant-b")
	if _, err := a.Enqueue(f.ctx, Reply("shared", "u-1", "for a")); err != nil {
		t.Fatal(err)
	}
	res, err := b.Enqueue(f.ctx, Reply("shared", "u-1", "for b"), Reply("only-b", "u-1", "b only"))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || res[0].Tenant != "tenant-b" {
		t.Fatalf("the same id in another tenant = %+v, want a new envelope", res[0])
	}
	other := Reply("sneaky", "u-1", "x")
	other.TenantID = "tenant-b"
	_, err = a.Enqueue(f.ctx, other)
	wantErr(t, err, queue.ErrCrossTenant, "Enqueue of another tenant's envelope through a scoped handle")

	// Reads.
	if _, err := a.Get(f.ctx, "only-b"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("scoped Get of another tenant's id: %v, want ErrNotFound", err)
	}
	f.wantNotFound("tenant-a", "only-b")
	st, err := a.Get(f.ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := st.Envelope.ReplyPayload(); p == nil || p.Text != "for a" {
		t.Fatal("tenant a reads tenant b's envelope")
	}

	// Claims and transitions.
	lb, err := b.Claim(f.ctx, req(10))
	if err != nil || len(lb) != 2 {
		t.Fatalf("b.Claim = %v, %v", keys(lb), err)
	}
	la, err := a.Claim(f.ctx, req(10))
	if err != nil || len(la) != 1 || la[0].Key.Tenant != "tenant-a" {
		t.Fatalf("a.Claim = %v, %v", keys(la), err)
	}
	wantErr(t, a.Commit(f.ctx, lb[0], queue.Outcome{State: envelope.StateSent}), queue.ErrCrossTenant, "a.Commit(b's lease)")
	wantErr(t, a.Release(f.ctx, lb[0]), queue.ErrCrossTenant, "a.Release(b's lease)")
	if s := f.seg("tenant-b", lb[0].Key.EnvelopeID, 0); s.State != envelope.StateSending || s.Fence != lb[0].Fence {
		t.Fatalf("b's row after a's attempts: %+v", s)
	}
	f.commit(lb[1], queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassInvalidRequest})
	wantErr(t, a.Requeue(f.ctx, lb[1].Key.EnvelopeID), queue.ErrNotFound, "a.Requeue(b's id)")
	if lb[1].Key.EnvelopeID == "only-b" {
		wantErr(t, a.Resolve(f.ctx, "only-b", envelope.StateSent), queue.ErrNotFound, "a.Resolve(b's id)")
	}
	f.wantState("tenant-b", lb[1].Key.EnvelopeID, 0, envelope.StateDeadLetter, "-")

	page, err := a.List(f.ctx, queue.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Rows) != 1 || page.Rows[0].Key.Tenant != "tenant-a" {
		t.Fatalf("a.List = %+v", page.Rows)
	}
	ca, err := a.Counts(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Total(envelope.StateSending) != 1 || ca.Total(envelope.StateDeadLetter) != 0 {
		t.Fatalf("a.Counts = %v", ca)
	}

	f.clock.Advance(DefaultLease)
	ra, err := a.Recover(f.ctx, queue.ClaimRequest{Owner: "rescuer-a", Lease: DefaultLease, Limit: 10})
	if err != nil || len(ra) != 1 || ra[0].Key.Tenant != "tenant-a" {
		t.Fatalf("a.Recover = %v, %v", keys(ra), err)
	}

	// Consent and erasure are per tenant.
	if err := a.SetConsent(f.ctx, "u-1", queue.ConsentFlags{PushEnabled: true}); err != nil {
		t.Fatal(err)
	}
	if c, _ := b.Consent(f.ctx, "u-1"); c.PushEnabled {
		t.Fatal("consent leaked across tenants")
	}
	if err := a.Erase(f.ctx, "u-1"); err != nil {
		t.Fatal(err)
	}
	f.wantNotFound("tenant-a", "shared")
	f.get("tenant-b", "shared")
	f.get("tenant-b", "only-b")
}

func testRequeue(t *testing.T, h Harness) {
	f := setup(t, h)
	wantErr(t, f.s.Requeue(f.ctx, dflt, "missing"), queue.ErrNotFound, "Requeue of an unknown id")
	f.enqueue(Reply("p", "u-1", "pending"))
	wantErr(t, f.s.Requeue(f.ctx, dflt, "p"), queue.ErrInvalidTransition, "Requeue of a pending envelope")

	// dead_letter → pending, history kept, claimable now.
	lp := f.claimOne("p")
	f.commit(lp, queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassInvalidRequest})
	f.clock.Advance(time.Minute)
	f.drain()
	if err := f.s.Requeue(f.ctx, dflt, "p"); err != nil {
		t.Fatalf("Requeue: %v", err)
	}
	f.wantNotify("Requeue")
	s := f.seg(dflt, "p", 0)
	if s.State != envelope.StatePending || !s.NextAt.Equal(f.clock.Now()) {
		t.Fatalf("after Requeue: %+v, want pending, due now", s)
	}
	wantHist := []queue.Attempt{
		{Attempt: 1, At: T0, State: envelope.StateDeadLetter, Class: envelope.ClassInvalidRequest},
		{Attempt: 1, At: f.clock.Now(), State: envelope.StatePending, Class: envelope.ClassOperator},
	}
	if !sameHistory(s.History, wantHist) {
		t.Fatalf("history = %+v, want %+v", s.History, wantHist)
	}
	wantErr(t, f.s.Requeue(f.ctx, dflt, "p"), queue.ErrInvalidTransition, "a second Requeue")
	l := f.claimOne("p")
	f.commit(l, queue.Outcome{State: envelope.StateSent})
	wantErr(t, f.s.Requeue(f.ctx, dflt, "p"), queue.ErrInvalidTransition, "Requeue of a delivered envelope")

	// suppressed (consent withdrawn) → pending once consent is back.
	f.grant(dflt, "u-2")
	f.enqueue(Nudge("n", "u-2"))
	if err := f.s.SetConsent(f.ctx, dflt, "u-2", queue.ConsentFlags{}); err != nil {
		t.Fatal(err)
	}
	f.noClaim("without consent")
	f.wantState(dflt, "n", 0, envelope.StateSuppressed, envelope.ClassConsentWithdrawn)
	f.grant(dflt, "u-2")
	if err := f.s.Requeue(f.ctx, dflt, "n"); err != nil {
		t.Fatal(err)
	}
	f.claimOne("n")

	// expired: a requeue would only expire it again, so it is refused,
	// saying why.
	x := Reply("x", "u-1", "soon stale")
	x.ExpiresAt = f.clock.Now().Add(time.Minute)
	f.enqueue(x)
	f.clock.Advance(time.Minute)
	f.noClaim("past expires_at")
	var te *queue.TransitionError
	if err := f.s.Requeue(f.ctx, dflt, "x"); !errors.As(err, &te) || te.Because != envelope.ClassExpired {
		t.Fatalf("Requeue of an expired envelope = %v, want a refusal naming expired", err)
	}
	f.wantState(dflt, "x", 0, envelope.StateExpired, envelope.ClassExpired)

	// A chat reply: the requeued segment goes first, later ones wait.
	f.replyOf("rp", "u-3", 3)
	f.commit(f.claim(1, envelope.ChannelTelegram)[0], queue.Outcome{State: envelope.StateSent})
	for _, l := range f.claim(10) {
		if l.Key.EnvelopeID != "rp" {
			continue
		}
		if l.Key.Segment != 1 {
			t.Fatalf("claimed %s, want segment 1", l.Key)
		}
		f.commit(l, queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassInvalidRequest})
	}
	f.clock.Advance(24 * time.Hour)
	f.noClaim("segment 2 behind a dead-lettered segment 1")
	// A segment that cannot go ends the ones after it, so that the
	// envelope is final (and can be pruned) until an operator requeues it.
	if st := f.get(dflt, "rp"); st.Status != string(envelope.StateDeadLetter) || st.Segments[2].State != envelope.StateDeadLetter {
		t.Fatalf("Get = status %q, segment 2 %s; want dead_letter for both", st.Status, st.Segments[2].State)
	}
	if err := f.s.Requeue(f.ctx, dflt, "rp"); err != nil {
		t.Fatal(err)
	}
	l1 := f.claimOne("rp")
	if l1.Key.Segment != 1 {
		t.Fatalf("after Requeue claimed %s, want segment 1", l1.Key)
	}
	f.noClaim("segment 2 while segment 1 is retried")
	f.commit(l1, queue.Outcome{State: envelope.StateSent})
	if l2 := f.claimOne("rp"); l2.Key.Segment != 2 {
		t.Fatalf("claimed %s, want segment 2", l2.Key)
	}
}

// testRequeueFreshBudget: a requeued row gets MaxAttempts new attempts,
// and its backoff starts again; attempts and history keep counting.
func testRequeueFreshBudget(t *testing.T, h Harness) {
	f := setup(t, h, func(o *queue.Options) { o.Backoff.MaxAttempts = 2 })
	f.enqueue(Reply("r", "u-1", "hi"))
	// history counts the failures and the operator's requeue.
	fail := func(attempt int, want envelope.State, history int) {
		t.Helper()
		l := f.claimOne("r")
		if l.Attempt != attempt {
			t.Fatalf("attempt = %d, want %d", l.Attempt, attempt)
		}
		f.commit(l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassTimeout})
		s := f.seg(dflt, "r", 0)
		if s.State != want || s.Attempts != attempt || len(s.History) != history {
			t.Fatalf("after attempt %d failed: %+v, want %s with %d history entries", attempt, s, want, history)
		}
		if want == envelope.StateRetryable && !s.NextAt.Equal(f.clock.Now().Add(time.Second)) {
			t.Fatalf("after attempt %d failed: due %v, want in 1s (the first backoff)", attempt, s.NextAt)
		}
		f.clock.Advance(time.Hour)
	}
	fail(1, envelope.StateRetryable, 1)
	fail(2, envelope.StateDeadLetter, 2)
	if err := f.s.Requeue(f.ctx, dflt, "r"); err != nil {
		t.Fatal(err)
	}
	fail(3, envelope.StateRetryable, 4)
	fail(4, envelope.StateDeadLetter, 5)
}

func testResolve(t *testing.T, h Harness) {
	f := setup(t, h)
	wantErr(t, f.s.Resolve(f.ctx, dflt, "missing", envelope.StateSent), queue.ErrNotFound, "Resolve of an unknown id")
	unresolved := func(id string) {
		t.Helper()
		f.enqueue(Reply(id, "u-1", "text"))
		l := f.claimOne(id)
		f.commit(l, queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown})
	}

	unresolved("s")
	for _, as := range []envelope.State{envelope.StateDeadLetter, envelope.StatePending, envelope.StateSending, envelope.StateBounced, ""} {
		wantErr(t, f.s.Resolve(f.ctx, dflt, "s", as), queue.ErrInvalidTransition, fmt.Sprintf("Resolve as %q", as))
	}
	f.wantState(dflt, "s", 0, envelope.StateUnresolved, envelope.ClassReconcileUnknown)
	f.clock.Advance(time.Minute)
	if err := f.s.Resolve(f.ctx, dflt, "s", envelope.StateSent); err != nil {
		t.Fatalf("Resolve sent: %v", err)
	}
	st := f.get(dflt, "s")
	if st.Status != queue.StatusDelivered {
		t.Fatalf("Status = %q, want delivered", st.Status)
	}
	h0 := st.Segments[0].History
	if last := h0[len(h0)-1]; last.State != envelope.StateSent || last.Class != envelope.ClassOperator || !last.At.Equal(f.clock.Now()) {
		t.Fatalf("last history entry = %+v, want sent by operator", last)
	}
	wantErr(t, f.s.Resolve(f.ctx, dflt, "s", envelope.StateSent), queue.ErrInvalidTransition, "a second Resolve")
	f.noClaim("after resolving as sent")

	unresolved("r")
	f.drain()
	if err := f.s.Resolve(f.ctx, dflt, "r", envelope.StateRetryable); err != nil {
		t.Fatalf("Resolve retryable: %v", err)
	}
	f.wantNotify("Resolve as retryable")
	if s := f.seg(dflt, "r", 0); s.State != envelope.StateRetryable || !s.NextAt.Equal(f.clock.Now()) {
		t.Fatalf("after Resolve retryable: %+v, want retryable due now", s)
	}
	if l := f.claimOne("r"); l.Attempt != 2 {
		t.Fatalf("attempt = %d, want 2", l.Attempt)
	}

	// Resolving a middle segment as sent lets the next one go.
	f.replyOf("rp", "u-2", 3)
	f.commit(f.claimOne("rp"), queue.Outcome{State: envelope.StateSent})
	f.commit(f.claimOne("rp"), queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown})
	f.noClaim("segment 2 behind an unresolved segment 1")
	if err := f.s.Resolve(f.ctx, dflt, "rp", envelope.StateSent); err != nil {
		t.Fatal(err)
	}
	if l := f.claimOne("rp"); l.Key.Segment != 2 {
		t.Fatalf("claimed %s, want segment 2", l.Key)
	}
}

func rowKeys(rows []queue.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Key.String()
	}
	return out
}

// listAll pages through List with f's filter and returns every row key
// and the number of pages.
func (f *fixture) listAll(filter queue.ListFilter) ([]string, int) {
	f.t.Helper()
	var all []string
	pages := 0
	for {
		p, err := f.s.List(f.ctx, filter)
		if err != nil {
			f.t.Fatalf("List(%+v): %v", filter, err)
		}
		pages++
		if filter.Limit > 0 && len(p.Rows) > filter.Limit {
			f.t.Fatalf("List page of %d rows, limit %d", len(p.Rows), filter.Limit)
		}
		all = append(all, rowKeys(p.Rows)...)
		if p.Next == "" {
			return all, pages
		}
		if pages > 10000 {
			f.t.Fatal("List never ends")
		}
		filter.Cursor = p.Next
	}
}

func testList(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.enqueue(Digest("d-1", "u-1"))
	f.replyOf("r-1", "u-1", 3)
	r3 := Reply("r-3", "u-2", "elsewhere")
	r3.TenantID = "t2"
	f.enqueue(Nudge("n-1", "u-1"), Reply("r-2", "u-1", "short"), r3)

	all := []string{key("d-1", 0), key("r-1", 0), key("r-1", 1), key("r-1", 2), key("n-1", 0), key("r-2", 0), "t2/r-3#0"}
	tests := []struct {
		name      string
		filter    queue.ListFilter
		want      []string
		wantPages int
	}{
		{"AllByThree", queue.ListFilter{Limit: 3}, all, 3},
		{"AllInOnePage", queue.ListFilter{Limit: 7}, all, 1},
		{"DefaultLimit", queue.ListFilter{}, all, 1},
		{"Tenant", queue.ListFilter{Tenant: dflt, Limit: 4}, all[:6], 2},
		{"OtherTenant", queue.ListFilter{Tenant: "t2"}, all[6:], 1},
		{"Channel", queue.ListFilter{Channel: envelope.ChannelTelegram, Limit: 2}, []string{key("r-1", 0), key("r-1", 1), key("r-1", 2), key("r-2", 0), "t2/r-3#0"}, 3},
		{"NoMatch", queue.ListFilter{State: envelope.StateBounced}, nil, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, pages := f.listAll(tc.filter)
			if len(got) != len(tc.want) || (len(got) > 0 && !equal(got, tc.want)) || pages != tc.wantPages {
				t.Fatalf("List = %v in %d pages, want %v in %d", got, pages, tc.want, tc.wantPages)
			}
		})
	}

	// State filter, and the fields of a row.
	f.clock.Advance(time.Minute)
	l := f.claim(1, envelope.ChannelEmail)[0]
	f.commit(l, queue.Outcome{State: envelope.StateSent})
	p, err := f.s.List(f.ctx, queue.ListFilter{State: envelope.StateSent})
	if err != nil {
		t.Fatal(err)
	}
	want := queue.Row{Key: envelope.Key{Tenant: dflt, EnvelopeID: "d-1"}, UserID: "u-1", Channel: envelope.ChannelEmail,
		State: envelope.StateSent, Attempts: 1, UpdatedAt: f.clock.Now()}
	if len(p.Rows) != 1 || p.Next != "" || p.Rows[0].Key != want.Key || p.Rows[0].UserID != want.UserID ||
		p.Rows[0].Channel != want.Channel || p.Rows[0].State != want.State || p.Rows[0].Attempts != 1 ||
		p.Rows[0].Class != "" || !p.Rows[0].UpdatedAt.Equal(want.UpdatedAt) {
		t.Fatalf("List(sent) = %+v, want [%+v]", p, want)
	}
	got, _ := f.listAll(queue.ListFilter{State: envelope.StatePending, Channel: envelope.ChannelTelegram, Tenant: dflt, Limit: 2})
	if !equal(got, []string{key("r-1", 0), key("r-1", 1), key("r-1", 2), key("r-2", 0)}) {
		t.Fatalf("List(pending telegram default) = %v", got)
	}

	if _, err := f.s.List(f.ctx, queue.ListFilter{Cursor: "%%% not a cursor %%%"}); !errors.Is(err, queue.ErrBadCursor) {
		t.Fatalf("List with a malformed cursor = %v, want ErrBadCursor", err)
	}
}

func testListLimits(t *testing.T, h Harness) {
	f := setup(t, h)
	const n = 1005
	envs := make([]*envelope.Envelope, n)
	for i := range envs {
		envs[i] = Reply(fmt.Sprintf("bulk-%04d", i), "u-1", "hi")
	}
	f.enqueue(envs...)

	p, err := f.s.List(f.ctx, queue.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rows) != 50 || p.Next == "" || p.Rows[0].Key.EnvelopeID != "bulk-0000" {
		t.Fatalf("default page: %d rows, next %q; want 50 rows and a cursor", len(p.Rows), p.Next)
	}
	p, err = f.s.List(f.ctx, queue.ListFilter{Limit: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rows) != 1000 || p.Next == "" || p.Rows[999].Key.EnvelopeID != "bulk-0999" {
		t.Fatalf("capped page: %d rows, next %q; want 1000 rows and a cursor", len(p.Rows), p.Next)
	}
	p, err = f.s.List(f.ctx, queue.ListFilter{Limit: 5000, Cursor: p.Next})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rows) != 5 || p.Next != "" || p.Rows[0].Key.EnvelopeID != "bulk-1000" {
		t.Fatalf("last page: %v, next %q", rowKeys(p.Rows), p.Next)
	}
}

func testCounts(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.grant("t2", "u-1")
	d2 := Digest("d2", "u-1")
	d2.TenantID = "t2"
	r2 := Reply("r2", "u-1", "hi")
	r2.TenantID = "t2"
	f.enqueue(Digest("d", "u-1"), Nudge("n", "u-1"), d2, r2)
	f.replyOf("r", "u-1", 3)

	check := func(tenant string, want map[envelope.State]map[envelope.Channel]int) {
		t.Helper()
		got := f.counts(tenant)
		for _, st := range envelope.States {
			for _, ch := range envelope.Channels {
				if got[st][ch] != want[st][ch] {
					t.Fatalf("Counts(%q)[%s][%s] = %d, want %d (all: %v)", tenant, st, ch, got[st][ch], want[st][ch], got)
				}
			}
		}
	}
	check(dflt, map[envelope.State]map[envelope.Channel]int{
		envelope.StatePending: {envelope.ChannelEmail: 1, envelope.ChannelPush: 1, envelope.ChannelTelegram: 3},
	})
	check("", map[envelope.State]map[envelope.Channel]int{
		envelope.StatePending: {envelope.ChannelEmail: 2, envelope.ChannelPush: 1, envelope.ChannelTelegram: 4},
	})
	if got := f.counts("").Total(envelope.StatePending); got != 7 {
		t.Fatalf("Total(pending) = %d, want 7", got)
	}

	f.commit(f.claimReq(queue.ClaimRequest{Tenant: dflt, Channels: []envelope.Channel{envelope.ChannelEmail}, Owner: "w", Lease: DefaultLease})[0],
		queue.Outcome{State: envelope.StateSent})
	f.commit(f.claim(1, envelope.ChannelPush)[0], queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassAuthFailed})
	f.claimReq(queue.ClaimRequest{Tenant: dflt, Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: DefaultLease})
	check(dflt, map[envelope.State]map[envelope.Channel]int{
		envelope.StateSent:       {envelope.ChannelEmail: 1},
		envelope.StateDeadLetter: {envelope.ChannelPush: 1},
		envelope.StateSending:    {envelope.ChannelTelegram: 1},
		envelope.StatePending:    {envelope.ChannelTelegram: 2},
	})
	check("t2", map[envelope.State]map[envelope.Channel]int{
		envelope.StatePending: {envelope.ChannelEmail: 1, envelope.ChannelTelegram: 1},
	})
	check("nobody", nil)
}

func testNextDue(t *testing.T, h Harness) {
	f := setup(t, h)
	f.wantNextDue(time.Time{})

	later := Reply("later", "u-1", "hi")
	later.NotBefore = T0.Add(time.Hour)
	f.enqueue(later)
	f.wantNextDue(T0.Add(time.Hour))
	f.enqueue(Reply("now", "u-1", "hi"))
	f.wantNextDue(T0)

	l := f.claimOne("now")
	f.wantNextDue(T0.Add(DefaultLease)) // the lease expiry
	f.commit(l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassTimeout})
	f.wantNextDue(T0.Add(time.Second)) // the backoff
	f.clock.Advance(time.Second)
	f.commit(f.claimOne("now"), queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown})
	f.wantNextDue(T0.Add(time.Hour)) // unresolved rows are not waiting

	f.clock.Set(T0.Add(time.Hour))
	f.commit(f.claimOne("later"), queue.Outcome{State: envelope.StateSent})
	f.wantNextDue(time.Time{})

	// Segments behind a dead letter are not waiting either.
	f.replyOf("rp", "u-1", 2)
	f.commit(f.claimOne("rp"), queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassInvalidRequest})
	f.wantNextDue(time.Time{})
}

// NextDue with a filter sees only the rows of its tenant and channels:
// rows due earlier elsewhere, waiting or leased, do not hide them.
func testNextDueFilter(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.grant("t2", "u-1")
	due := func(flt queue.DueFilter, want time.Time) {
		t.Helper()
		got, err := f.s.NextDue(f.ctx, flt)
		if err != nil {
			t.Fatalf("NextDue(%+v): %v", flt, err)
		}
		if !got.Equal(want) {
			t.Fatalf("NextDue(%+v) = %v, want %v", flt, got, want)
		}
	}
	push, tg := queue.DueFilter{Channels: []envelope.Channel{envelope.ChannelPush}}, queue.DueFilter{Channels: []envelope.Channel{envelope.ChannelTelegram}}
	t2 := queue.DueFilter{Tenant: "t2"}

	f.enqueue(Reply("now", "u-1", "hi")) // default tenant, telegram, due at T0
	nudge := Nudge("later", "u-1")
	nudge.NotBefore = T0.Add(time.Hour)
	r2 := Reply("t2-later", "u-1", "hi")
	r2.TenantID, r2.NotBefore = "t2", T0.Add(2*time.Hour)
	f.enqueue(nudge, r2)

	due(queue.DueFilter{}, T0)
	due(push, T0.Add(time.Hour))
	due(tg, T0)
	due(t2, T0.Add(2*time.Hour))
	due(queue.DueFilter{Tenant: "t2", Channels: []envelope.Channel{envelope.ChannelPush}}, time.Time{})
	due(queue.DueFilter{Tenant: dflt, Channels: []envelope.Channel{envelope.ChannelPush, envelope.ChannelEmail}}, T0.Add(time.Hour))

	// A lease counts for its own tenant and channel only.
	f.claimReq(queue.ClaimRequest{Owner: "worker-1", Lease: 3 * time.Hour, Limit: 1, Channels: []envelope.Channel{envelope.ChannelTelegram}})
	due(tg, T0.Add(2*time.Hour)) // t2's reply is due before the lease ends
	due(queue.DueFilter{Tenant: dflt, Channels: tg.Channels}, T0.Add(3*time.Hour))
	due(push, T0.Add(time.Hour))
	due(t2, T0.Add(2*time.Hour))
	due(queue.DueFilter{Tenant: dflt}, T0.Add(time.Hour))
}

func testNotify(t *testing.T, h Harness) {
	f := setup(t, h)
	if f.s.Notify() == nil {
		t.Fatal("Notify returned nil")
	}
	f.drain()
	f.enqueue(Reply("a", "u-1", "hi"))
	f.wantNotify("Enqueue")

	l := f.claimOne("a")
	f.drain()
	if err := f.s.Release(f.ctx, l); err != nil {
		t.Fatal(err)
	}
	f.wantNotify("Release")

	l = f.claimOne("a")
	f.drain()
	f.commit(l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassReconcileRejected, NoAttempt: true})
	f.wantNotify("a retry due at once")

	// Signals coalesce: many events, one pending value, nothing blocks.
	f.drain()
	for i := range 5 {
		f.enqueue(Reply(fmt.Sprintf("burst-%d", i), "u-1", "hi"))
	}
	f.wantNotify("a burst of enqueues")
}

func testConsentRecords(t *testing.T, h Harness) {
	f := setup(t, h)
	if c := f.consent(dflt, "nobody"); c.ConsentFlags != (queue.ConsentFlags{}) || len(c.Suppressions) != 0 || !c.UpdatedAt.IsZero() {
		t.Fatalf("Consent of an unknown user = %+v, want the zero Consent", c)
	}
	f.clock.Advance(time.Minute)
	flags := queue.ConsentFlags{DigestEnabled: true, PushEnabled: true, EmailVerified: true, Cadence: "daily"}
	if err := f.s.SetConsent(f.ctx, dflt, "u-1", flags); err != nil {
		t.Fatal(err)
	}
	c := f.consent(dflt, "u-1")
	if c.ConsentFlags != flags || !c.UpdatedAt.Equal(T0.Add(time.Minute)) {
		t.Fatalf("Consent = %+v, want %+v updated at T0+1m", c, flags)
	}

	email := queue.Suppression{Channel: envelope.ChannelEmail, Target: queue.TargetOf(Digest("", "u-1")), Reason: envelope.ClassBounced, At: T0}
	push := queue.Suppression{Channel: envelope.ChannelPush, Reason: envelope.ClassUnsubscribed, At: T0}
	for _, s := range []queue.Suppression{email, email, push, {Channel: email.Channel, Target: email.Target, Reason: envelope.ClassComplaint, At: T0}} {
		if err := f.s.Suppress(f.ctx, dflt, "u-1", s); err != nil {
			t.Fatal(err)
		}
	}
	c = f.consent(dflt, "u-1")
	if len(c.Suppressions) != 2 || !sameSuppression(c.Suppressions[0], email) || !sameSuppression(c.Suppressions[1], push) {
		t.Fatalf("suppressions = %+v, want [%+v %+v] (one per channel and target)", c.Suppressions, email, push)
	}

	// SetConsent keeps suppressions.
	f.clock.Advance(time.Minute)
	if err := f.s.SetConsent(f.ctx, dflt, "u-1", queue.ConsentFlags{Cadence: "weekly"}); err != nil {
		t.Fatal(err)
	}
	c = f.consent(dflt, "u-1")
	if c.DigestEnabled || c.Cadence != "weekly" || len(c.Suppressions) != 2 || !c.UpdatedAt.Equal(T0.Add(2*time.Minute)) {
		t.Fatalf("after SetConsent: %+v", c)
	}
	// The returned record is a copy.
	c.Suppressions[0].Reason = "tampered"
	if f.consent(dflt, "u-1").Suppressions[0].Reason != envelope.ClassBounced {
		t.Fatal("changing a returned Consent changed the stored one")
	}
	if c := f.consent("t2", "u-1"); c.ConsentFlags != (queue.ConsentFlags{}) || len(c.Suppressions) != 0 {
		t.Fatalf("Consent in another tenant = %+v", c)
	}
}

func testErase(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.grant(dflt, "u-2")
	f.grant("t2", "u-1")
	if err := f.s.Suppress(f.ctx, dflt, "u-1", queue.Suppression{Channel: envelope.ChannelPush, Reason: envelope.ClassUnsubscribed, At: T0}); err != nil {
		t.Fatal(err)
	}
	r9 := Reply("r-9", "u-1", "other tenant")
	r9.TenantID = "t2"
	f.enqueue(Digest("d-1", "u-1"), Nudge("n-2", "u-2"), r9)
	f.replyOf("r-1", "u-1", 3)
	l := f.claimReq(queue.ClaimRequest{Tenant: dflt, Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: DefaultLease})[0]

	if err := f.s.Erase(f.ctx, dflt, "u-1"); err != nil {
		t.Fatalf("Erase: %v", err)
	}
	f.wantNotFound(dflt, "d-1")
	f.wantNotFound(dflt, "r-1")
	if c := f.consent(dflt, "u-1"); c.ConsentFlags != (queue.ConsentFlags{}) || len(c.Suppressions) != 0 {
		t.Fatalf("consent after Erase = %+v, want none", c)
	}
	wantErr(t, f.s.Commit(f.ctx, l, queue.Outcome{State: envelope.StateSent}), queue.ErrLeaseLost, "Commit of an erased lease")

	// Other users and other tenants are untouched.
	f.get(dflt, "n-2")
	f.get("t2", "r-9")
	if c := f.consent("t2", "u-1"); !c.DigestEnabled {
		t.Fatal("Erase removed consent in another tenant")
	}
	if got := f.counts(dflt).Total(envelope.StatePending); got != 1 {
		t.Fatalf("pending rows in default = %d, want 1", got)
	}
	got, _ := f.listAll(queue.ListFilter{})
	if !equal(got, []string{key("n-2", 0), "t2/r-9#0"}) {
		t.Fatalf("List after Erase = %v", got)
	}
	if ls := sorted(keys(f.claim(10))); !equal(ls, sorted([]string{key("n-2", 0), "t2/r-9#0"})) {
		t.Fatalf("Claim after Erase = %v", ls)
	}
	if err := f.s.Erase(f.ctx, dflt, "never-seen"); err != nil {
		t.Fatalf("Erase of an unknown user: %v", err)
	}
}

func testPrune(t *testing.T, h Harness) {
	f := setup(t, h, func(o *queue.Options) { o.Retention = time.Hour })
	b := Reply("B", "u-1", "not yet")
	b.NotBefore = T0.Add(48 * time.Hour)
	late := Reply("F", "u-1", "will expire")
	late.NotBefore = T0.Add(90 * time.Second)
	late.ExpiresAt = T0.Add(2 * time.Minute)
	f.enqueue(Reply("A", "u-1", "a"), Reply("C", "u-1", "c"))
	f.replyOf("D", "u-1", 3)
	f.enqueue(Reply("E", "u-1", "e"), b, late)

	f.clock.Set(T0.Add(time.Minute))
	ls := map[string]*queue.Lease{}
	for _, l := range f.claim(10) {
		ls[l.Key.String()] = l
	}
	if len(ls) != 4 {
		t.Fatalf("Claim = %v, want A C D#0 E", ls)
	}
	f.commit(ls[key("A", 0)], queue.Outcome{State: envelope.StateSent})
	f.commit(ls[key("C", 0)], queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassInvalidRequest})
	f.commit(ls[key("D", 0)], queue.Outcome{State: envelope.StateSent})
	f.commit(ls[key("E", 0)], queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown})

	f.clock.Set(T0.Add(2 * time.Minute))
	d1 := f.claimOne("D") // F expires in the same claim
	f.commit(d1, queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassInvalidRequest})
	f.wantState(dflt, "F", 0, envelope.StateExpired, envelope.ClassExpired)

	prune := func(want int) {
		t.Helper()
		n, err := f.s.Prune(f.ctx)
		if err != nil {
			t.Fatalf("Prune: %v", err)
		}
		if n != want {
			t.Fatalf("Prune at %v = %d, want %d", f.clock.Now().Sub(T0), n, want)
		}
	}
	prune(0)
	f.clock.Set(T0.Add(time.Minute + time.Hour - time.Second))
	prune(0)
	f.clock.Set(T0.Add(time.Minute + time.Hour + time.Second))
	prune(2) // A (sent) and C (dead_letter); F was updated later
	f.wantNotFound(dflt, "A")
	f.wantNotFound(dflt, "C")
	f.get(dflt, "F")
	prune(0)
	f.clock.Set(T0.Add(2*time.Minute + time.Hour + time.Second))
	prune(2) // F (expired) and D (its dead segment 1 ended segment 2)
	f.wantNotFound(dflt, "F")
	f.wantNotFound(dflt, "D")

	// Not all terminal: a pending row, an unresolved row.
	f.clock.Advance(30 * 24 * time.Hour)
	prune(0)
	for _, id := range []string{"B", "E"} {
		f.get(dflt, id)
	}
	got, _ := f.listAll(queue.ListFilter{})
	if !equal(got, []string{key("E", 0), key("B", 0)}) {
		t.Fatalf("List after Prune = %v", got)
	}
}

func testClose(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("r", "u-1", "hi"), Reply("q", "u-1", "hi"))
	l := f.claim(1)[0]
	if err := f.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := f.s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx, s := f.ctx, f.s
	calls := map[string]func() error{
		"Enqueue": func() error { _, err := s.Enqueue(ctx, Reply("x", "u-1", "hi")); return err },
		"Claim":   func() error { _, err := s.Claim(ctx, req(1)); return err },
		"Commit":  func() error { return s.Commit(ctx, l, queue.Outcome{State: envelope.StateSent}) },
		"Release": func() error { return s.Release(ctx, l) },
		"Recover": func() error { _, err := s.Recover(ctx, req(1)); return err },
		"NextDue": func() error { _, err := s.NextDue(ctx, queue.DueFilter{}); return err },
		"Get":     func() error { _, err := s.Get(ctx, dflt, "r"); return err },
		"List":    func() error { _, err := s.List(ctx, queue.ListFilter{}); return err },
		"Counts":  func() error { _, err := s.Counts(ctx, ""); return err },
		"Requeue": func() error { return s.Requeue(ctx, dflt, "r") },
		"Resolve": func() error { return s.Resolve(ctx, dflt, "r", envelope.StateSent) },
		"Consent": func() error { _, err := s.Consent(ctx, dflt, "u-1"); return err },
		"SetConsent": func() error {
			return s.SetConsent(ctx, dflt, "u-1", queue.ConsentFlags{PushEnabled: true})
		},
		"Suppress": func() error {
			return s.Suppress(ctx, dflt, "u-1", queue.Suppression{Channel: envelope.ChannelPush, Reason: envelope.ClassUnsubscribed, At: T0})
		},
		"Erase": func() error { return s.Erase(ctx, dflt, "u-1") },
		"Prune": func() error { _, err := s.Prune(ctx); return err },
		"SaveSubscription": func() error {
			return s.SaveSubscription(ctx, dflt, "u-1", pushSub("u-1", ""))
		},
		"DeleteSubscription": func() error { return s.DeleteSubscription(ctx, dflt, "u-1", EndpointOf("u-1")) },
		"Subscriptions":      func() error { _, err := s.Subscriptions(ctx, dflt, "u-1"); return err },
		"SuppressEmail": func() error {
			return s.SuppressEmail(ctx, dflt, EmailOf("u-1"), envelope.ClassBounced)
		},
	}
	for name, call := range calls {
		wantErr(t, call(), queue.ErrClosed, name+" after Close")
	}
}
