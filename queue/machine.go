package queue

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// The delivery state machine. Every change of a row's state, by any store,
// is computed here: a store loads an envelope's rows, calls one of the
// functions below, and persists the rows the Step says changed (under its
// own fence-guarded write), then applies the Step's side effects. A store
// decides nothing of its own, so two stores cannot drift apart, and every
// state change is checked against envelope.Transitions.

// Delivery is the delivery state of one row (one segment of an envelope):
// the part of a row that every store persists and the state machine
// computes. Stores keep their keys and indexes beside it.
type Delivery struct {
	State    envelope.State
	Attempts int // provider attempts so far
	// Budget is Attempts at the last operator requeue: backoff and the
	// attempt limit count from it, while Attempts keeps growing.
	Budget  int
	Class   envelope.ErrorClass
	Receipt string
	// Due is when a pending or retryable row becomes eligible; zero while
	// it waits for the previous segment.
	Due time.Time
	// The lease, while sending.
	Owner    string
	Fence    uint64
	LeaseEnd time.Time
	// From is the state the row was claimed from (pending or retryable),
	// or sending for a recovery lease (Recover).
	From      envelope.State
	ToPending bool // the lease was claimed with ExpireToPending
	Updated   time.Time
	History   []Attempt
}

// Eligible reports whether a claim may lease d at now.
func (d *Delivery) Eligible(now time.Time) bool {
	return (d.State == envelope.StatePending || d.State == envelope.StateRetryable) &&
		!d.Due.IsZero() && !d.Due.After(now)
}

// Waiting reports whether d waits for the previous segment to be sent.
func (d *Delivery) Waiting() bool {
	return d.State == envelope.StatePending && d.Due.IsZero()
}

// WakeAt returns when d next needs the store's attention: its due time, its
// lease's end, or the zero time when nothing happens to it by itself.
func (d *Delivery) WakeAt() time.Time {
	switch d.State {
	case envelope.StatePending, envelope.StateRetryable:
		return d.Due
	case envelope.StateSending:
		return d.LeaseEnd
	}
	return time.Time{}
}

// Step is the result of one state machine step on an envelope's rows.
type Step struct {
	// Rows is every row of the envelope after the step, in segment order.
	Rows []Delivery
	// Changed lists the segments whose row changed (the ones to persist).
	Changed []int
	// Wake reports that a row may be claimable now (signal Notify).
	Wake bool
	// Suppress, when not empty, is the reason of a suppression the store
	// writes into the user's consent record in the same transaction:
	// SuppressionFor(envelope, Suppress, now).
	Suppress envelope.ErrorClass
	// Gone reports that the recipient itself is gone (a bounce or a
	// complaint, not a user's choice): the store also writes the tenant's
	// address suppression that AddressSuppression returns, if any.
	Gone bool
}

// AddressSuppression returns the tenant's address suppression a step asks
// for beside the user's (Suppress): a bounce or complaint of an e-mail
// envelope e suppresses its address for every user of the tenant. ok is
// false for any other step or channel.
func (s *Step) AddressSuppression(e *envelope.Envelope, now time.Time) (Suppression, bool) {
	if s.Suppress == "" || !s.Gone || AddressTarget(e) == "" {
		return Suppression{}, false
	}
	return Suppression{Channel: e.Channel, Target: AddressTarget(e), Reason: s.Suppress, At: now}, true
}

func newStep(rows []Delivery) *Step {
	return &Step{Rows: slices.Clone(rows)}
}

func (s *Step) touch(seg int) {
	if !slices.Contains(s.Changed, seg) {
		s.Changed = append(s.Changed, seg)
		slices.Sort(s.Changed)
	}
}

// move changes row seg to state to, checking the edge against the table.
func (s *Step) move(seg int, to envelope.State, now time.Time) error {
	d := &s.Rows[seg]
	if d.State != to && !envelope.CanTransition(d.State, to) {
		return fmt.Errorf("%w: segment %d %s → %s", ErrInvalidTransition, seg, d.State, to)
	}
	d.State = to
	d.Updated = now
	if to != envelope.StateSending {
		d.Owner, d.LeaseEnd, d.From, d.ToPending = "", time.Time{}, "", false
	}
	if to != envelope.StatePending && to != envelope.StateRetryable {
		d.Due = time.Time{}
	}
	s.touch(seg)
	return nil
}

// record appends a history entry to row seg without sharing the old slice.
func (s *Step) record(seg, attempt int, class envelope.ErrorClass, now time.Time) {
	d := &s.Rows[seg]
	d.History = append(slices.Clip(d.History), Attempt{Attempt: attempt, At: now, State: d.State, Class: class})
}

// settle moves row seg, which no call holds, to a state it ends in without
// a provider call (expired, suppressed, dead_letter), with class.
func (s *Step) settle(seg int, to envelope.State, class envelope.ErrorClass, now time.Time) error {
	if err := s.move(seg, to, now); err != nil {
		return err
	}
	s.Rows[seg].Class = class
	s.record(seg, s.Rows[seg].Attempts, class, now)
	return nil
}

// settleRest ends the segments after seg that can no longer go because seg
// did not: every later row that is not sending and not already final.
func (s *Step) settleRest(seg int, to envelope.State, class envelope.ErrorClass, now time.Time) error {
	for i := seg + 1; i < len(s.Rows); i++ {
		switch s.Rows[i].State {
		case envelope.StatePending, envelope.StateRetryable:
			if err := s.settle(i, to, class, now); err != nil {
				return err
			}
		}
	}
	return nil
}

// unblockAfter makes the segment after seg due now if it waits for it.
func (s *Step) unblockAfter(seg int, now time.Time) {
	if i := seg + 1; i < len(s.Rows) && s.Rows[i].Waiting() {
		s.Rows[i].Due = now
		s.touch(i)
		s.Wake = true
	}
}

// NewRows returns the rows of a newly stored envelope with segs segments:
// the first due at once (or at not_before), the others waiting for their
// turn.
func NewRows(e *envelope.Envelope, segs int, now time.Time) []Delivery {
	rows := make([]Delivery, segs)
	for i := range rows {
		rows[i] = Delivery{State: envelope.StatePending, Updated: now}
	}
	if segs > 0 {
		rows[0].Due = now
		if e.NotBefore.After(now) {
			rows[0].Due = e.NotBefore
		}
	}
	return rows
}

// Refuse ends every row of a newly indexed envelope that current consent
// refuses (v: suppressed and why), as a claim would have.
func Refuse(rows []Delivery, v Verdict, now time.Time) (*Step, error) {
	s := newStep(rows)
	if len(rows) == 0 {
		return s, nil
	}
	if err := s.settle(0, v.State, v.Class, now); err != nil {
		return nil, err
	}
	return s, s.settleRest(0, v.State, v.Class, now)
}

// Expired reports whether an envelope with expiresAt (zero: never) is past
// it at now.
func Expired(expiresAt, now time.Time) bool {
	return !expiresAt.IsZero() && !now.Before(expiresAt)
}

// Rebuilt returns the rows of an envelope with segs segments whose index
// was rebuilt from the logs: nothing says whether they were sent, so every
// row is unresolved (class index_rebuilt, for an operator to resolve or
// requeue), or expired when the envelope is past expiresAt. Nothing is
// redelivered blindly. Every row is in Changed.
func Rebuilt(segs int, expiresAt time.Time, now time.Time) (*Step, error) {
	s := newStep(NewRows(&envelope.Envelope{}, segs, now))
	to, class := envelope.StateUnresolved, envelope.ClassIndexRebuilt
	if Expired(expiresAt, now) {
		to, class = envelope.StateExpired, envelope.ClassExpired
	}
	for i := range s.Rows {
		if err := s.settle(i, to, class, now); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Restored settles the rows of an envelope whose database was restored
// from a backup: every row that was still to deliver (pending, sending,
// retryable) may have been delivered after the backup was taken, so it is
// unresolved (never redelivered automatically); the others stay.
func Restored(rows []Delivery, now time.Time) (*Step, error) {
	s := newStep(rows)
	for i := range s.Rows {
		switch s.Rows[i].State {
		case envelope.StatePending, envelope.StateSending, envelope.StateRetryable:
			if err := s.settle(i, envelope.StateUnresolved, envelope.ClassRestored, now); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Verdict is what a claim does with an eligible row.
type Verdict struct {
	State envelope.State // sending (lease it), expired, suppressed or dead_letter
	Class envelope.ErrorClass
}

// Judge decides what a claim at now does with a row of e, given the user's
// current consent (found: a consent record exists) and the tenant's
// suppression of e's address (addr, nil when there is none): see Permits.
func Judge(e *envelope.Envelope, c Consent, found bool, addr *Suppression, now time.Time) Verdict {
	if Expired(e.ExpiresAt, now) {
		return Verdict{envelope.StateExpired, envelope.ClassExpired}
	}
	if ok, why := Permits(e, &c, found, addr); !ok {
		return Verdict{envelope.StateSuppressed, why}
	}
	return Verdict{State: envelope.StateSending}
}

// RecordLost is the verdict for a row whose envelope record cannot be read
// back: it can never be sent.
var RecordLost = Verdict{envelope.StateDeadLetter, envelope.ClassRecordLost}

// Claim applies a claim's verdict v to eligible row seg. A sending verdict
// leases the row to req.Owner with the fence the store issues (fence is
// called only then); any other verdict ends the row and the segments after
// it.
func Claim(rows []Delivery, seg int, v Verdict, req ClaimRequest, fence func() uint64, now time.Time) (*Step, error) {
	if err := inRange(rows, seg); err != nil {
		return nil, err
	}
	s := newStep(rows)
	if !s.Rows[seg].Eligible(now) {
		return nil, fmt.Errorf("%w: segment %d is %s, not eligible", ErrInvalidTransition, seg, s.Rows[seg].State)
	}
	if v.State != envelope.StateSending {
		if err := s.settle(seg, v.State, v.Class, now); err != nil {
			return nil, err
		}
		return s, s.settleRest(seg, v.State, v.Class, now)
	}
	from := s.Rows[seg].State
	if err := s.move(seg, envelope.StateSending, now); err != nil {
		return nil, err
	}
	d := &s.Rows[seg]
	d.From = from
	d.Attempts++
	d.Owner = req.Owner
	d.Fence = fence()
	d.LeaseEnd = now.Add(req.Lease)
	d.Due = time.Time{}
	d.ToPending = req.ExpireToPending
	return s, nil
}

// inRange refuses a segment an envelope does not have (a damaged index
// entry names one).
func inRange(rows []Delivery, seg int) error {
	if seg < 0 || seg >= len(rows) {
		return fmt.Errorf("%w: segment %d of an envelope of %d", ErrInvalidTransition, seg, len(rows))
	}
	return nil
}

// Holds reports whether lease l holds row d. Fences never go backwards, so
// a row with a newer fence was leased again since (ErrStaleFence), and a
// row with an older one is not the row that was leased (it was erased and
// enqueued again: ErrLeaseLost); a row that is no longer sending is
// ErrLeaseLost.
func Holds(d *Delivery, l *Lease) error {
	switch {
	case d.Fence > l.Fence:
		return ErrStaleFence
	case d.Fence < l.Fence, d.State != envelope.StateSending:
		return ErrLeaseLost
	case d.Owner != l.Owner:
		return ErrStaleFence
	}
	return nil
}

// defaultClass is the class an outcome gets when the worker gave none.
func defaultClass(s envelope.State) envelope.ErrorClass {
	switch s {
	case envelope.StateBounced:
		return envelope.ClassBounced
	case envelope.StateComplaint:
		return envelope.ClassComplaint
	case envelope.StateSuppressed:
		return envelope.ClassUnsubscribed
	case envelope.StateExpired:
		return envelope.ClassExpired
	}
	return ""
}

// Commit applies outcome out to the row that lease l holds. A retryable
// outcome becomes dead_letter once the attempts since the last requeue
// reach b's maximum. A sent segment makes the next one due; a segment that
// ends otherwise (dead_letter, bounced, complaint, suppressed, expired)
// ends the segments after it; bounced, complaint and suppressed also ask
// for a suppression (Step.Suppress).
func Commit(b Backoff, rows []Delivery, l *Lease, out Outcome, now time.Time) (*Step, error) {
	if !ValidOutcome(out.State) {
		return nil, fmt.Errorf("%w: cannot commit %q", ErrInvalidTransition, out.State)
	}
	seg := l.Key.Segment
	if seg < 0 || seg >= len(rows) {
		return nil, ErrLeaseLost
	}
	if err := Holds(&rows[seg], l); err != nil {
		return nil, err
	}
	s := newStep(rows)
	d := &s.Rows[seg]
	attempt := d.Attempts
	to, next := b.Decide(out, d.Attempts-d.Budget, now)
	if to == envelope.StateRetryable && out.NoAttempt && d.Attempts > 0 {
		d.Attempts--
	}
	class := out.Class
	if class == "" {
		class = defaultClass(to)
	}
	if to == envelope.StateSent {
		class = ""
		d.Receipt = out.Receipt
	}
	if err := s.move(seg, to, now); err != nil {
		return nil, err
	}
	d.Class = class
	s.record(seg, attempt, class, now)
	switch {
	case to == envelope.StateSent:
		s.unblockAfter(seg, now)
	case to == envelope.StateRetryable:
		if next.IsZero() {
			next = now
		}
		d.Due = next
		s.Wake = !next.After(now)
	case to == envelope.StateUnresolved:
		// Later segments wait until an operator resolves this one.
	default:
		if Suppressing(to) {
			s.Suppress = class
			s.Gone = to == envelope.StateBounced || to == envelope.StateComplaint
			to = envelope.StateSuppressed
		}
		if err := s.settleRest(seg, to, class, now); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Release gives back the lease l holds, whose provider call never started:
// the row returns to the state it was claimed from, due now, without
// counting the attempt. A recovery lease stays sending with its lease
// expired, to be reconciled again: the earlier call's outcome is unknown.
func Release(rows []Delivery, l *Lease, now time.Time) (*Step, error) {
	seg := l.Key.Segment
	if seg < 0 || seg >= len(rows) {
		return nil, ErrLeaseLost
	}
	if err := Holds(&rows[seg], l); err != nil {
		return nil, err
	}
	s := newStep(rows)
	d := &s.Rows[seg]
	s.Wake = true
	if d.From == envelope.StateSending {
		d.Owner, d.LeaseEnd, d.Updated = "", now, now
		s.touch(seg)
		return s, nil
	}
	from := d.From
	if from == "" {
		from = envelope.StatePending
	}
	if d.Attempts > 0 {
		d.Attempts--
	}
	if err := s.move(seg, from, now); err != nil {
		return nil, err
	}
	d.Due = now
	return s, nil
}

// LeaseExpired reports whether row d is sending with its lease over at now.
func LeaseExpired(d *Delivery, now time.Time) bool {
	return d.State == envelope.StateSending && !d.LeaseEnd.After(now)
}

// Recover takes over row seg, whose lease expired, for reconciliation: it
// gets a new owner and fence and stays sending, its attempts unchanged. A
// row leased with ExpireToPending goes back to pending instead (leased is
// then false, and fence is not called).
func Recover(rows []Delivery, seg int, req ClaimRequest, fence func() uint64, now time.Time) (s *Step, leased bool, err error) {
	if err := inRange(rows, seg); err != nil {
		return nil, false, err
	}
	if !LeaseExpired(&rows[seg], now) {
		return nil, false, fmt.Errorf("%w: segment %d holds a live lease or is not sending", ErrInvalidTransition, seg)
	}
	if rows[seg].ToPending {
		s, err := ExpireLease(rows, seg, now)
		return s, false, err
	}
	s = newStep(rows)
	d := &s.Rows[seg]
	d.Owner = req.Owner
	d.Fence = fence()
	d.LeaseEnd = now.Add(req.Lease)
	d.From = envelope.StateSending
	d.ToPending = false
	d.Updated = now
	s.touch(seg)
	return s, true, nil
}

// RecordGone settles row seg, whose lease expired, when its record can no
// longer be read (its log was deleted or cut): whether the provider got it
// cannot be asked (reconciling needs the message) and it can never be sent
// again, so it becomes unresolved, class record_lost, for an operator to
// settle; never leased again (a store that cannot read it would recover it
// for ever). A seam lease (ExpireToPending) goes back to pending instead,
// where a claim dead-letters the lost record.
func RecordGone(rows []Delivery, seg int, now time.Time) (*Step, error) {
	if err := inRange(rows, seg); err != nil {
		return nil, err
	}
	if !LeaseExpired(&rows[seg], now) {
		return nil, fmt.Errorf("%w: segment %d holds a live lease or is not sending", ErrInvalidTransition, seg)
	}
	if rows[seg].ToPending {
		return ExpireLease(rows, seg, now)
	}
	s := newStep(rows)
	if err := s.settle(seg, envelope.StateUnresolved, envelope.ClassRecordLost, now); err != nil {
		return nil, err
	}
	return s, nil
}

// ExpireLease returns row seg, whose ExpireToPending lease (the HTTP
// seam's) expired, to pending, due now.
func ExpireLease(rows []Delivery, seg int, now time.Time) (*Step, error) {
	if err := inRange(rows, seg); err != nil {
		return nil, err
	}
	if !LeaseExpired(&rows[seg], now) || !rows[seg].ToPending {
		return nil, fmt.Errorf("%w: segment %d has no expired seam lease", ErrInvalidTransition, seg)
	}
	s := newStep(rows)
	if err := s.move(seg, envelope.StatePending, now); err != nil {
		return nil, err
	}
	s.Rows[seg].Due = now
	s.record(seg, s.Rows[seg].Attempts, envelope.ClassInterrupted, now)
	s.Wake = true
	return s, nil
}

// Requeueable reports whether an operator requeue applies to state st.
func Requeueable(st envelope.State) bool { return slices.Contains(requeueable, st) }

var requeueable = []envelope.State{envelope.StateDeadLetter, envelope.StateUnresolved, envelope.StateExpired, envelope.StateSuppressed}

// Requeue returns an envelope's dead_letter, unresolved, expired and
// suppressed segments to pending with a fresh attempt budget (attempts,
// the last error class and history are kept). The first segment not sent
// is due now; the later ones wait for their turn. When that first segment
// cannot be requeued (bounced, complaint: the recipient is gone), nothing
// can go, and Requeue refuses. It refuses too when v, what a claim would
// decide now (Judge), does not send: the envelope would only end again
// (consent still refuses it, it is past expires_at, its record is gone),
// and the refusal says why.
func Requeue(rows []Delivery, v Verdict, now time.Time) (*Step, error) {
	s := newStep(rows)
	first := slices.IndexFunc(s.Rows, func(d Delivery) bool { return d.State != envelope.StateSent })
	if first < 0 || !Requeueable(s.Rows[first].State) {
		return nil, refused("requeue", rows, requeueable...)
	}
	if v.State != envelope.StateSending {
		e := refused("requeue", rows, requeueable...)
		e.Would, e.Because = v.State, v.Class
		return nil, e
	}
	for i := first; i < len(s.Rows); i++ {
		if !Requeueable(s.Rows[i].State) {
			continue
		}
		if err := s.move(i, envelope.StatePending, now); err != nil {
			return nil, err
		}
		d := &s.Rows[i]
		d.Budget = d.Attempts
		s.record(i, d.Attempts, envelope.ClassOperator, now)
	}
	s.order(now)
	return s, nil
}

// Resolve settles an envelope's unresolved segments as sent (the next
// segment becomes due) or retryable (due now), after an operator checked
// with the provider.
func Resolve(rows []Delivery, as envelope.State, now time.Time) (*Step, error) {
	if err := CheckResolve(as); err != nil {
		return nil, err
	}
	s := newStep(rows)
	for i := range s.Rows {
		if s.Rows[i].State != envelope.StateUnresolved {
			continue
		}
		if err := s.move(i, as, now); err != nil {
			return nil, err
		}
		if as == envelope.StateSent {
			s.Rows[i].Class = ""
		}
		s.record(i, s.Rows[i].Attempts, envelope.ClassOperator, now)
	}
	if len(s.Changed) == 0 {
		return nil, refused("resolve", rows, envelope.StateUnresolved)
	}
	s.order(now)
	return s, nil
}

// CheckResolve reports whether an operator may resolve a segment as as
// (sent or retryable). Stores check it before they look the envelope up.
func CheckResolve(as envelope.State) error {
	if as != envelope.StateSent && as != envelope.StateRetryable {
		return fmt.Errorf("%w: resolve as %q (want sent or retryable)", ErrInvalidTransition, as)
	}
	return nil
}

// order keeps chat order after an operator act: only the first segment not
// sent may be due (now, unless it is already due); the later ones wait.
func (s *Step) order(now time.Time) {
	first := true
	for i := range s.Rows {
		d := &s.Rows[i]
		if d.State == envelope.StateSent {
			continue
		}
		if d.State == envelope.StatePending || d.State == envelope.StateRetryable {
			want := time.Time{}
			if first {
				if want = d.Due; want.IsZero() {
					want = now
				}
			}
			if !want.Equal(d.Due) {
				d.Due = want
				s.touch(i)
			}
			if first && !want.After(now) {
				s.Wake = true
			}
		}
		first = false
	}
}

// TransitionError is an operator action (requeue, resolve) that does not
// apply to an envelope's current state. It is ErrInvalidTransition, and its
// message names the states only (never an id or a user), so it may be
// shown to an operator or an HTTP client as it is.
type TransitionError struct {
	Action string           // "requeue" or "resolve"
	States []envelope.State // the envelope's segments, in order
	Want   []envelope.State // the states the action applies to
	// Would and Because, when set: a requeue would only end the envelope
	// again, in state Would for reason Because (a claim's verdict now).
	Would   envelope.State
	Because envelope.ErrorClass
}

func refused(action string, rows []Delivery, want ...envelope.State) *TransitionError {
	e := &TransitionError{Action: action, Want: want}
	for _, d := range rows {
		e.States = append(e.States, d.State)
	}
	return e
}

func (e *TransitionError) Error() string { return "queue: invalid transition: " + e.Explain() }

// Explain is the message without the package prefix.
func (e *TransitionError) Explain() string {
	is := "the envelope has no segments"
	if len(e.States) > 0 {
		is = "the envelope is " + joinStates(e.States, ", ")
		if len(e.States) > 1 {
			is = "the envelope's segments are " + joinStates(e.States, ", ")
		}
		if first := slices.IndexFunc(e.States, func(s envelope.State) bool { return s != envelope.StateSent }); e.Action == "requeue" && first > 0 {
			is += fmt.Sprintf(" (the first not sent, segment %d, decides)", first)
		}
	}
	if e.Would != "" {
		return fmt.Sprintf("%s does not apply: %s, and a claim now would end it %s (%s): %s", e.Action, is, e.Would, e.Because, lift(e.Because))
	}
	return fmt.Sprintf("%s does not apply: %s; %s applies to %s", e.Action, is, e.Action, joinStates(e.Want, ", "))
}

// lift says what has to change before a refused requeue can go.
func lift(c envelope.ErrorClass) string {
	switch c {
	case envelope.ClassExpired:
		return "it is past its expires_at; enqueue a new envelope instead"
	case envelope.ClassRecordLost:
		return "its record is gone from its log; it cannot be sent"
	case envelope.ClassNoConsent, envelope.ClassConsentWithdrawn, envelope.ClassUnsubscribed:
		return "the user's consent must allow it first (PUT /v1/consent, outbox consent set)"
	}
	return "lift the suppression first (outbox consent lift, or outbox suppressions lift for an address)"
}

func (e *TransitionError) Is(target error) bool { return target == ErrInvalidTransition }

func joinStates(states []envelope.State, sep string) string {
	var b strings.Builder
	for i, s := range states {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(string(s))
	}
	return b.String()
}
