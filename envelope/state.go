package envelope

import (
	"fmt"
	"strings"
)

// State is the state of one delivery row (one segment of an envelope).
// Edges lists the legal changes; the queue's state machine enforces them.
type State string

// Delivery states (SPEC §4).
const (
	StatePending    State = "pending"
	StateSending    State = "sending"
	StateSent       State = "sent"
	StateRetryable  State = "retryable"
	StateDeadLetter State = "dead_letter"
	StateBounced    State = "bounced"
	StateComplaint  State = "complaint"
	StateSuppressed State = "suppressed"
	StateExpired    State = "expired"
	StateUnresolved State = "unresolved"
)

// States lists every state in a stable order.
var States = []State{
	StatePending, StateSending, StateSent, StateRetryable, StateDeadLetter,
	StateBounced, StateComplaint, StateSuppressed, StateExpired, StateUnresolved,
}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	for _, x := range States {
		if x == s {
			return true
		}
	}
	return false
}

// Terminal reports whether no automatic transition leaves s.
// unresolved is not terminal (an operator resolves it) but it is never
// claimed automatically either.
func (s State) Terminal() bool {
	switch s {
	case StateSent, StateDeadLetter, StateBounced, StateComplaint, StateSuppressed, StateExpired:
		return true
	}
	return false
}

// Edge is one legal edge of the delivery state machine, with what takes it.
type Edge struct {
	From, To State
	Why      string
}

// Edges lists every legal edge of the delivery state machine, operator
// edges (requeue, resolve) included. The queue's state machine
// (queue/machine.go) refuses any other change, and the README's diagram is
// Diagram's output.
var Edges = []Edge{
	{StatePending, StateSending, "claim (attempt+1, new fence)"},
	{StateRetryable, StateSending, "claim when backoff is due"},
	{StateSending, StateSent, "provider accepted"},
	{StateSending, StateRetryable, "retryable error (backoff, Retry-After as minimum), or released"},
	{StateSending, StateDeadLetter, "permanent error / max attempts"},
	{StateSending, StateBounced, "recipient gone (suppression written in the same transaction)"},
	{StateSending, StateComplaint, "complaint (suppression written)"},
	{StateSending, StateSuppressed, "unsubscribed or blocked (suppression written)"},
	{StateSending, StateExpired, "provider says too late"},
	{StateSending, StatePending, "released (call never started), or a seam lease expired"},
	{StateSending, StateUnresolved, "reconciliation could not tell"},
	{StatePending, StateExpired, "past expires_at, or an earlier segment expired"},
	{StatePending, StateSuppressed, "consent withdrawn, or an earlier segment's recipient gone"},
	{StatePending, StateDeadLetter, "record lost, or an earlier segment dead-lettered"},
	{StatePending, StateUnresolved, "index rebuilt from the logs, or database restored (fate unknown)"},
	{StateRetryable, StateExpired, "past expires_at"},
	{StateRetryable, StateSuppressed, "consent withdrawn"},
	{StateRetryable, StateDeadLetter, "record lost"},
	{StateRetryable, StateUnresolved, "database restored from a backup (fate unknown)"},
	{StateUnresolved, StateSent, "operator resolve --as sent"},
	{StateUnresolved, StateRetryable, "operator resolve --as retry"},
	{StateUnresolved, StatePending, "operator requeue"},
	{StateDeadLetter, StatePending, "operator requeue"},
	{StateExpired, StatePending, "operator requeue"},
	{StateSuppressed, StatePending, "operator requeue"},
}

// Transitions maps each state to the states it may move to (from Edges).
var Transitions = func() map[State][]State {
	m := make(map[State][]State, len(States))
	for _, s := range States {
		m[s] = []State{}
	}
	for _, e := range Edges {
		m[e.From] = append(m[e.From], e.To)
	}
	return m
}()

// Diagram returns the state machine as a Mermaid state diagram (the one in
// the README).
func Diagram() string {
	var b strings.Builder
	b.WriteString("stateDiagram-v2\n    [*] --> pending: enqueue\n")
	for _, e := range Edges {
		fmt.Fprintf(&b, "    %s --> %s: %s\n", e.From, e.To, e.Why)
	}
	return b.String()
}

// CanTransition reports whether from → to is a legal edge.
func CanTransition(from, to State) bool {
	for _, s := range Transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// ParseState returns s as a State, or an error listing the valid ones
// (without s: the message may go into an HTTP answer).
func ParseState(s string) (State, error) {
	if st := State(s); st.Valid() {
		return st, nil
	}
	return "", fmt.Errorf("unknown state (want one of %s)", joinNames(States))
}

// ParseChannel returns s as a Channel, or an error listing the valid ones.
func ParseChannel(s string) (Channel, error) {
	if ch := Channel(s); ch.Valid() {
		return ch, nil
	}
	return "", fmt.Errorf("unknown channel (want one of %s)", joinNames(Channels))
}

func joinNames[T ~string](names []T) string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	return strings.Join(s, ", ")
}
