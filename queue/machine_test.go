package queue_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

var t0 = time.Date(2026, time.March, 2, 9, 0, 0, 0, time.UTC)

// edges records every state change between two row sets.
type edges map[[2]envelope.State]bool

func (e edges) see(before []queue.Delivery, s *queue.Step) {
	for _, i := range s.Changed {
		if from, to := before[i].State, s.Rows[i].State; from != to {
			e[[2]envelope.State{from, to}] = true
		}
	}
}

func lease(rows []queue.Delivery, seg int) *queue.Lease {
	d := rows[seg]
	return &queue.Lease{Key: envelope.Key{Segment: seg}, Owner: d.Owner, Fence: d.Fence}
}

func musts(t *testing.T) func(*queue.Step, error) *queue.Step {
	return func(s *queue.Step, err error) *queue.Step {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// TestMachine_EveryEdgeIsTaken drives the state machine through every edge
// of envelope.Edges and checks that it takes no other: the table is
// complete, and nothing in it is dead.
func TestMachine_EveryEdgeIsTaken(t *testing.T) {
	must := musts(t)
	seen := edges{}
	b := queue.Backoff{NoJitter: true, Base: time.Second, MaxAttempts: 2}
	var fence uint64
	next := func() uint64 { fence++; return fence }
	env := &envelope.Envelope{}
	req := queue.ClaimRequest{Owner: "w", Lease: time.Minute}

	// run applies f to rows, records the edges and returns the new rows.
	run := func(rows []queue.Delivery, f func([]queue.Delivery) (*queue.Step, error)) []queue.Delivery {
		t.Helper()
		s := must(f(rows))
		seen.see(rows, s)
		return s.Rows
	}
	claim := func(rows []queue.Delivery, seg int, v queue.Verdict) []queue.Delivery {
		return run(rows, func(r []queue.Delivery) (*queue.Step, error) { return queue.Claim(r, seg, v, req, next, t0) })
	}
	send := queue.Verdict{State: envelope.StateSending}
	commit := func(rows []queue.Delivery, seg int, out queue.Outcome) []queue.Delivery {
		return run(rows, func(r []queue.Delivery) (*queue.Step, error) { return queue.Commit(b, r, lease(r, seg), out, t0) })
	}
	requeue := func(rows []queue.Delivery) []queue.Delivery {
		return run(rows, func(r []queue.Delivery) (*queue.Step, error) { return queue.Requeue(r, send, t0) })
	}
	fresh := func(segs int) []queue.Delivery { return queue.NewRows(env, segs, t0) }

	// Every commit outcome from a claimed pending row; the endings settle
	// the later segment, and requeue brings each back.
	for _, st := range []envelope.State{envelope.StateSent, envelope.StateRetryable, envelope.StateDeadLetter,
		envelope.StateBounced, envelope.StateComplaint, envelope.StateSuppressed, envelope.StateExpired, envelope.StateUnresolved} {
		rows := commit(claim(fresh(2), 0, send), 0, queue.Outcome{State: st})
		if queue.Requeueable(rows[0].State) {
			requeue(rows)
		}
	}
	// Verdicts at claim, from pending and from retryable.
	for _, v := range []queue.Verdict{{State: envelope.StateExpired, Class: envelope.ClassExpired},
		{State: envelope.StateSuppressed, Class: envelope.ClassConsentWithdrawn}, queue.RecordLost} {
		claim(fresh(1), 0, v)
		rows := commit(claim(fresh(1), 0, send), 0, queue.Outcome{State: envelope.StateRetryable, RetryAfter: -time.Hour})
		rows[0].Due = t0
		claim(rows, 0, v)
	}
	// A retry claimed again, then max attempts.
	rows := commit(claim(fresh(1), 0, send), 0, queue.Outcome{State: envelope.StateRetryable})
	rows[0].Due = t0
	rows = commit(claim(rows, 0, send), 0, queue.Outcome{State: envelope.StateRetryable})
	if rows[0].State != envelope.StateDeadLetter {
		t.Fatalf("after max attempts: %s", rows[0].State)
	}
	// Release from pending and from retryable.
	release := func(r []queue.Delivery) (*queue.Step, error) { return queue.Release(r, lease(r, 0), t0) }
	run(claim(fresh(1), 0, send), release)
	rows = commit(claim(fresh(1), 0, send), 0, queue.Outcome{State: envelope.StateRetryable, RetryAfter: -time.Hour})
	rows[0].Due = t0
	run(claim(rows, 0, send), release)
	// A seam lease that expires; resolve both ways.
	seam := queue.ClaimRequest{Owner: "seam", Lease: time.Minute, ExpireToPending: true}
	rows = run(fresh(1), func(r []queue.Delivery) (*queue.Step, error) { return queue.Claim(r, 0, send, seam, next, t0) })
	run(rows, func(r []queue.Delivery) (*queue.Step, error) { return queue.ExpireLease(r, 0, t0.Add(time.Hour)) })
	for _, as := range []envelope.State{envelope.StateSent, envelope.StateRetryable} {
		rows := commit(claim(fresh(1), 0, send), 0, queue.Outcome{State: envelope.StateUnresolved})
		run(rows, func(r []queue.Delivery) (*queue.Step, error) { return queue.Resolve(r, as, t0) })
	}

	// An index rebuilt from the logs.
	run(fresh(2), func([]queue.Delivery) (*queue.Step, error) { return queue.Rebuilt(2, time.Time{}, t0) })
	run(fresh(1), func([]queue.Delivery) (*queue.Step, error) { return queue.Rebuilt(1, t0, t0) })

	// A database restored from a backup: rows still to deliver, whatever
	// their state, end unresolved; the others stay.
	restored := func(r []queue.Delivery) (*queue.Step, error) { return queue.Restored(r, t0) }
	run(fresh(2), restored)
	rows = commit(claim(fresh(1), 0, send), 0, queue.Outcome{State: envelope.StateRetryable})
	run(rows, restored)
	rows = run(claim(fresh(3), 0, send), restored)
	for i, r := range rows {
		if r.State != envelope.StateUnresolved || r.Class != envelope.ClassRestored {
			t.Errorf("restored row %d = %s %s", i, r.State, r.Class)
		}
	}
	rows = commit(claim(fresh(2), 0, send), 0, queue.Outcome{State: envelope.StateSent})
	if rows = run(rows, restored); rows[0].State != envelope.StateSent || rows[1].State != envelope.StateUnresolved {
		t.Errorf("restored sent + pending = %s, %s", rows[0].State, rows[1].State)
	}

	want := edges{}
	for _, e := range envelope.Edges {
		want[[2]envelope.State{e.From, e.To}] = true
	}
	for e := range want {
		if !seen[e] {
			t.Errorf("edge %s → %s is in envelope.Edges but the state machine never takes it", e[0], e[1])
		}
	}
	for e := range seen {
		if !want[e] {
			t.Errorf("the state machine took %s → %s, which envelope.Edges does not list", e[0], e[1])
		}
	}
}

// TestMachine_RefusesIllegalEdges: a change the table does not list is an
// error and no Step.
func TestMachine_RefusesIllegalEdges(t *testing.T) {
	rows := []queue.Delivery{{State: envelope.StateSent}}
	if _, err := queue.Requeue(rows, send, t0); !errors.Is(err, queue.ErrInvalidTransition) {
		t.Fatalf("requeue of a sent row: %v", err)
	}
	if _, err := queue.Resolve(rows, envelope.StateSent, t0); !errors.Is(err, queue.ErrInvalidTransition) {
		t.Fatalf("resolve of a sent row: %v", err)
	}
	// A bounced row cannot be claimed even if a store lost its due time.
	rows = []queue.Delivery{{State: envelope.StateBounced, Due: t0}}
	if _, err := queue.Claim(rows, 0, queue.Verdict{State: envelope.StateSending}, queue.ClaimRequest{Owner: "w", Lease: time.Second}, func() uint64 { return 1 }, t0); !errors.Is(err, queue.ErrInvalidTransition) {
		t.Fatalf("claim of a bounced row: %v", err)
	}
	// A segment the envelope does not have (a damaged index entry).
	if _, err := queue.Claim(queue.NewRows(&envelope.Envelope{}, 1, t0), 3, queue.Verdict{State: envelope.StateSending}, queue.ClaimRequest{Owner: "w", Lease: time.Second}, func() uint64 { return 1 }, t0); !errors.Is(err, queue.ErrInvalidTransition) {
		t.Fatalf("claim of segment 3 of 1: %v", err)
	}
	if _, _, err := queue.Recover(queue.NewRows(&envelope.Envelope{}, 1, t0), -1, queue.ClaimRequest{Owner: "w", Lease: time.Second}, func() uint64 { return 1 }, t0); !errors.Is(err, queue.ErrInvalidTransition) {
		t.Fatalf("recover of segment -1: %v", err)
	}
	if _, err := queue.Commit(queue.Backoff{}, []queue.Delivery{{State: envelope.StateSending, Owner: "w", Fence: 1}},
		&queue.Lease{Owner: "w", Fence: 1}, queue.Outcome{State: envelope.StatePending}, t0); !errors.Is(err, queue.ErrInvalidTransition) {
		t.Fatalf("commit pending: %v", err)
	}
}

// TestMachine_ChatOrder: segment i+1 is due only once segment i is sent,
// also after an operator requeue of a dead-lettered envelope.
func TestMachine_ChatOrder(t *testing.T) {
	must := musts(t)
	b := queue.Backoff{NoJitter: true, MaxAttempts: 1}
	req := queue.ClaimRequest{Owner: "w", Lease: time.Minute}
	var f uint64
	next := func() uint64 { f++; return f }
	send := queue.Verdict{State: envelope.StateSending}
	rows := queue.NewRows(&envelope.Envelope{}, 3, t0)
	if !rows[0].Eligible(t0) || rows[1].Eligible(t0) || !rows[1].Waiting() {
		t.Fatalf("new rows: %+v", rows)
	}
	s := must(queue.Claim(rows, 0, send, req, next, t0))
	s = must(queue.Commit(b, s.Rows, lease(s.Rows, 0), queue.Outcome{State: envelope.StateSent}, t0))
	if !s.Rows[1].Eligible(t0) || !s.Wake || s.Rows[2].Eligible(t0) {
		t.Fatalf("after segment 0 sent: %+v", s.Rows)
	}
	s = must(queue.Claim(s.Rows, 1, send, req, next, t0))
	s = must(queue.Commit(b, s.Rows, lease(s.Rows, 1), queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassNetwork}, t0))
	for i, want := range []envelope.State{envelope.StateSent, envelope.StateDeadLetter, envelope.StateDeadLetter} {
		if s.Rows[i].State != want {
			t.Fatalf("segment %d is %s, want %s (rows %+v)", i, s.Rows[i].State, want, s.Rows)
		}
	}
	s = must(queue.Requeue(s.Rows, send, t0))
	if !s.Rows[1].Eligible(t0) || s.Rows[2].Eligible(t0) || !s.Rows[2].Waiting() {
		t.Fatalf("after requeue only segment 1 may be due: %+v", s.Rows)
	}
}

// TestMachine_StepDoesNotAlias: a Step never writes into the caller's rows.
func TestMachine_StepDoesNotAlias(t *testing.T) {
	must := musts(t)
	rows := queue.NewRows(&envelope.Envelope{}, 1, t0)
	rows[0].History = make([]queue.Attempt, 0, 8)
	before := rows[0]
	s := must(queue.Claim(rows, 0, queue.Verdict{State: envelope.StateSending}, queue.ClaimRequest{Owner: "w", Lease: time.Minute}, func() uint64 { return 7 }, t0))
	s = must(queue.Commit(queue.Backoff{}, s.Rows, lease(s.Rows, 0), queue.Outcome{State: envelope.StateSent}, t0))
	if rows[0].State != before.State || len(rows[0].History) != 0 || len(rows[0].History[:1]) == 1 && rows[0].History[:1][0].State != "" {
		t.Fatalf("caller's rows changed: %+v", rows[0])
	}
	if len(s.Rows[0].History) != 1 {
		t.Fatalf("history: %+v", s.Rows[0].History)
	}
}

// TestReadmeDiagramIsTheTable: the README's state diagram is
// envelope.Diagram(), so it cannot drift from the table.
func TestReadmeDiagramIsTheTable(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "```mermaid\n")
	if i < 0 {
		t.Fatal("README has no mermaid block")
	}
	rest := readme[i+len("```mermaid\n"):]
	j := strings.Index(rest, "```")
	if got, want := rest[:j], envelope.Diagram(); got != want {
		t.Fatalf("README diagram differs from envelope.Diagram(); replace it with:\n%s", want)
	}
}

// A refused operator action says what the envelope is and what the action
// applies to, and is still ErrInvalidTransition.
func TestTransitionError_NamesStates(t *testing.T) {
	now := time.Unix(1e9, 0)
	rows := []queue.Delivery{{State: envelope.StateSent}, {State: envelope.StateBounced}, {State: envelope.StateDeadLetter}}
	_, err := queue.Requeue(rows, send, now)
	var te *queue.TransitionError
	if !errors.Is(err, queue.ErrInvalidTransition) || !errors.As(err, &te) {
		t.Fatalf("Requeue of a bounced envelope = %v", err)
	}
	want := "requeue does not apply: the envelope's segments are sent, bounced, dead_letter (the first not sent, segment 1, decides); requeue applies to dead_letter, unresolved, expired, suppressed"
	if te.Explain() != want {
		t.Fatalf("Explain:\n got %s\nwant %s", te.Explain(), want)
	}
	_, err = queue.Resolve(rows[:1], envelope.StateSent, now)
	if err == nil || err.Error() != "queue: invalid transition: resolve does not apply: the envelope is sent; resolve applies to unresolved" {
		t.Fatalf("Resolve of a sent envelope = %v", err)
	}
}

// A recovered row whose record is gone ends unresolved, record_lost; a live
// lease is refused; a seam lease goes back to pending.
func TestRecordGone(t *testing.T) {
	now := time.Unix(1e9, 0)
	expired := queue.Delivery{State: envelope.StateSending, Owner: "w", Fence: 3, LeaseEnd: now.Add(-time.Second), Attempts: 1}
	st, err := queue.RecordGone([]queue.Delivery{expired}, 0, now)
	if err != nil || st.Rows[0].State != envelope.StateUnresolved || st.Rows[0].Class != envelope.ClassRecordLost || st.Rows[0].Owner != "" {
		t.Fatalf("RecordGone = %+v, %v", st, err)
	}
	live := expired
	live.LeaseEnd = now.Add(time.Minute)
	if _, err := queue.RecordGone([]queue.Delivery{live}, 0, now); !errors.Is(err, queue.ErrInvalidTransition) {
		t.Fatalf("RecordGone of a live lease = %v", err)
	}
	seam := expired
	seam.ToPending = true
	if st, err := queue.RecordGone([]queue.Delivery{seam}, 0, now); err != nil || st.Rows[0].State != envelope.StatePending {
		t.Fatalf("RecordGone of a seam lease = %+v, %v", st, err)
	}
}

// send is the verdict of a claim that would lease the row.
var send = queue.Verdict{State: envelope.StateSending}

// A requeue that a claim would only end again is refused, with the reason.
func TestRequeue_RefusedWhenItWouldEndAgain(t *testing.T) {
	now := time.Unix(1e9, 0)
	rows := []queue.Delivery{{State: envelope.StateSuppressed, Class: envelope.ClassBlockedByUser}}
	_, err := queue.Requeue(rows, queue.Verdict{State: envelope.StateSuppressed, Class: envelope.ClassBlockedByUser}, now)
	var te *queue.TransitionError
	if !errors.As(err, &te) || te.Because != envelope.ClassBlockedByUser || !strings.Contains(err.Error(), "a claim now would end it suppressed (blocked_by_user): lift the suppression first") {
		t.Fatalf("Requeue of a still blocked chat = %v", err)
	}
	if st, err := queue.Requeue(rows, send, now); err != nil || st.Rows[0].State != envelope.StatePending {
		t.Fatalf("Requeue once the block is lifted = %+v, %v", st, err)
	}
}
