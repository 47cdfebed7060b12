package envelope

// State is the state of one delivery row (one segment of an envelope).
//
// The legal edges are listed in Transitions; the queue enforces them.
//
//	pending ──claim──► sending ──sent──► sent
//	   ▲                 │ ├──retryable──► retryable ──(due)──claim──► sending
//	   │                 │ ├──permanent / max attempts──► dead_letter
//	   │                 │ ├──recipient gone──► bounced | complaint | suppressed
//	   │                 │ ├──released (call never started)──► pending | retryable
//	   │                 │ └──lease expired──reconcile──► sent | retryable | unresolved
//	   ├── past expires_at ──► expired        consent withdrawn ──► suppressed
//	   └── operator requeue ◄── dead_letter | unresolved | expired | suppressed
//	unresolved ──operator resolve──► sent | retryable
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

// Transitions lists every legal edge of the delivery state machine.
// Operator edges (requeue, resolve) are included.
var Transitions = map[State][]State{
	StatePending:    {StateSending, StateExpired, StateSuppressed},
	StateRetryable:  {StateSending, StateExpired, StateSuppressed, StateDeadLetter},
	StateSending:    {StateSent, StateRetryable, StateDeadLetter, StateBounced, StateComplaint, StateSuppressed, StateExpired, StatePending, StateUnresolved},
	StateUnresolved: {StateSent, StateRetryable, StatePending},
	StateDeadLetter: {StatePending},
	StateExpired:    {StatePending},
	StateSuppressed: {StatePending},
	StateSent:       {},
	StateBounced:    {},
	StateComplaint:  {},
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
