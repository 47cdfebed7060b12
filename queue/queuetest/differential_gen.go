package queuetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// diffGen generates a run's operations from a seed, looking at the
// model's state to pick targets (a live lease, an envelope to requeue).
// Each seed also draws its own mix (swarm testing): the weights of the
// operations, how often a commit is a retry, how often a claim is
// ExpireToPending and how many ids the envelopes share, so that some runs
// dwell on retries of a few rows and others on many rows and leases.
type diffGen struct {
	rng      *rand.Rand
	weights  []weighted
	reopen   bool
	rebuild  bool
	closing  bool
	retry    float64 // share of retryable outcomes
	e2p      float64 // share of ExpireToPending claims
	ids      int     // ids per kind of envelope
	grants   int     // the first steps grant every consent to a user
	excluded []string
}

type weighted struct {
	kind string
	w    int
}

// The mix of operations (relative weights).
var diffWeights = []weighted{
	{"enqueue", 14}, {"consent", 4}, {"suppress", 2}, {"suppress-email", 2}, {"claim", 14}, {"commit", 16},
	{"release", 3}, {"advance", 12}, {"recover", 5}, {"requeue", 3}, {"resolve", 3},
	{"erase", 2}, {"prune", 2}, {"reopen", 2}, {"rebuild", 2}, {"edge", 1}, {"work", 10},
}

func newDiffGen(seed uint64, cfg DiffConfig) *diffGen {
	g := &diffGen{rng: rand.New(rand.NewPCG(seed, 0x6f7574626f78)), excluded: cfg.Exclude}
	for _, s := range cfg.Stores {
		g.reopen = g.reopen || s.Harness.Reopen != nil
		g.rebuild = g.rebuild || s.Harness.Rebuilt != nil
	}
	g.closing = !slices.Contains(cfg.Exclude, "close") && g.chance(1.0/3)
	g.retry = oneOf(g, 0.15, 0.3, 0.3, 0.6)
	g.e2p = oneOf(g, 0.0, 0.15, 0.15, 0.5)
	g.ids = oneOf(g, 1, 2, 3, 3, 4)
	g.grants = oneOf(g, 0, 1, 2, 3, 3)
	// A third of the runs are mostly a worker: turns of claim and commit,
	// with time moved to the next due row, retrying rows to their limit.
	worker := g.chance(1.0 / 3)
	if worker {
		g.retry = oneOf(g, 0.6, 0.85)
	}
	for _, w := range diffWeights {
		if slices.Contains(cfg.Exclude, w.kind) || (w.kind == "reopen" && !g.reopen) || (w.kind == "rebuild" && !g.rebuild) {
			continue
		}
		switch {
		case worker && (w.kind == "work" || w.kind == "advance"):
			w.w *= 4
		case w.kind == "enqueue", w.kind == "claim", w.kind == "commit", w.kind == "advance", w.kind == "work":
			w.w *= oneOf(g, 1, 1, 2)
		default:
			w.w = int(float64(w.w) * oneOf(g, 0.0, 0.5, 1, 1, 2, 3))
		}
		g.weights = append(g.weights, w)
	}
	return g
}

func oneOf[T any](g *diffGen, xs ...T) T { return xs[g.rng.IntN(len(xs))] }

func (g *diffGen) chance(p float64) bool { return g.rng.Float64() < p }

var (
	diffTenants = []string{"", "", "", envelope.DefaultTenant, "acme", "acme"}
	diffUsers   = []string{"u-1", "u-2", "u-3"}
)

// diffSharedEmail is an address several users' digests go to, now and
// then (a family inbox): a suppression of it reaches them all.
const diffSharedEmail = "family.inbox@example.com"

// diffAddress returns an address of the run: a user's own, the shared
// one, or one no envelope carries.
func (g *diffGen) diffAddress() string {
	switch g.rng.IntN(5) {
	case 0, 1:
		return diffSharedEmail
	case 2:
		return "nobody@example.com"
	}
	return EmailOf(oneOf(g, diffUsers...))
}

// next returns the step's operation. A third of the runs end with Close.
func (g *diffGen) next(r *diffRun, step int) diffOp {
	if step == r.steps-1 && g.closing {
		return opClose{}
	}
	if step < g.grants && !slices.Contains(g.excluded, "consent") {
		return &opAdmin{what: "consent", tenant: oneOf(g, diffTenants...), id: oneOf(g, diffUsers...),
			flags: queue.ConsentFlags{DigestEnabled: true, PushEnabled: true, EmailVerified: true, Cadence: "weekly"}}
	}
	total := 0
	for _, w := range g.weights {
		total += w.w
	}
	if total == 0 {
		return nil
	}
	for {
		n := g.rng.IntN(total)
		for _, w := range g.weights {
			if n -= w.w; n < 0 {
				if op := g.build(r, w.kind); op != nil {
					return op
				}
				break
			}
		}
	}
}

func (g *diffGen) build(r *diffRun, kind string) diffOp {
	now := r.parties[0].clock.Now()
	switch kind {
	case "enqueue":
		return g.enqueue(now)
	case "consent":
		f := queue.ConsentFlags{DigestEnabled: true, PushEnabled: true, EmailVerified: true, Cadence: "weekly"}
		if g.chance(0.4) {
			f = queue.ConsentFlags{DigestEnabled: g.chance(0.6), PushEnabled: g.chance(0.6), EmailVerified: g.chance(0.6), Cadence: oneOf(g, "weekly", "daily", "")}
		}
		return &opAdmin{what: "consent", tenant: oneOf(g, diffTenants...), id: oneOf(g, diffUsers...), flags: f}
	case "suppress":
		user := oneOf(g, diffUsers...)
		return &opAdmin{what: "suppress", tenant: oneOf(g, diffTenants...), id: user, sup: g.suppression(user, now)}
	case "suppress-email":
		// Now and then an operator lifts one instead (or one that is not
		// there).
		if g.chance(0.25) {
			return &opAdmin{what: "lift-address", tenant: oneOf(g, diffTenants...), id: queue.TargetOfValue("email:" + g.diffAddress())}
		}
		return &opAdmin{what: "suppress-email", tenant: oneOf(g, diffTenants...), id: g.diffAddress(),
			sup: queue.Suppression{Reason: oneOf(g, envelope.ClassBounced, envelope.ClassComplaint, envelope.ClassUnsubscribed)}}
	case "claim", "recover":
		return g.claim(kind == "recover")
	case "work":
		c := g.claim(false).(*opClaim)
		c.req.ExpireToPending = false
		w := &opWork{req: c.req}
		for range max(c.req.Limit, 1) {
			w.outs = append(w.outs, g.outcome())
		}
		if g.chance(0.5) {
			w.recover = true
			w.rreq = g.claim(true).(*opClaim).req
			w.rreq.Owner, w.rreq.Lease = c.req.Owner, c.req.Lease
			for range max(w.rreq.Limit, 1) {
				w.routs = append(w.routs, oneOf(g,
					queue.Outcome{State: envelope.StateSent, Receipt: "found"},
					queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassReconcileRejected, NoAttempt: true},
					queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown}))
			}
		}
		return w
	case "commit":
		ref, ok := g.lease(r, 0.8)
		if !ok {
			return nil
		}
		return &opCommit{ref: ref, out: g.outcome()}
	case "release":
		ref, ok := g.lease(r, 0.6)
		if !ok {
			return nil
		}
		return &opRelease{ref: ref}
	case "advance":
		// Half the time to the next due time or lease end, when later.
		if due, _ := r.model.NextDue(r.ctx, queue.DueFilter{}); due.After(now) && g.chance(0.5) {
			return &opAdvance{d: due.Sub(now)}
		}
		return &opAdvance{d: oneOf(g,
			time.Millisecond, time.Second, time.Second, 2*time.Second, 10*time.Second, 10*time.Second,
			30*time.Second, 30*time.Second, 31*time.Second, time.Minute, 2*time.Minute, 5*time.Minute,
			time.Hour, time.Hour, 2*time.Hour, 25*time.Hour)}
	case "requeue", "resolve":
		return g.operator(r, kind)
	case "erase":
		users := sortedPairs(r.users)
		if len(users) == 0 {
			return nil
		}
		u := oneOf(g, users...)
		return &opAdmin{what: "erase", tenant: g.tenantName(u.a), id: u.b}
	case "prune":
		return &opAdmin{what: "prune"}
	case "reopen":
		return opReopen{}
	case "rebuild":
		return opRebuild{}
	case "edge":
		tenant := oneOf(g, diffTenants...)
		switch g.rng.IntN(5) {
		case 4:
			return &opAdmin{what: "nil", edge: true}
		case 0:
			return &opAdmin{what: "consent", tenant: tenant, flags: queue.ConsentFlags{PushEnabled: true}, edge: true}
		case 1:
			return &opAdmin{what: "suppress", tenant: tenant, sup: queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassUnsubscribed}, edge: true}
		case 2:
			return &opAdmin{what: "erase", tenant: tenant, edge: true}
		default:
			return &opAdmin{what: "suppress", tenant: tenant, id: oneOf(g, diffUsers...), sup: queue.Suppression{Channel: "sms", Reason: envelope.ClassUnsubscribed}, edge: true}
		}
	}
	return nil
}

// tenantName spells a tenant as a caller may: "" for the default tenant
// now and then.
func (g *diffGen) tenantName(t string) string {
	if t == envelope.DefaultTenant && g.chance(0.5) {
		return ""
	}
	return t
}

var replyTexts = sync.OnceValue(func() []string { return []string{ReplyText(2), ReplyText(3)} })

// enqueue builds a batch of one to four envelopes: every channel and
// template, chat replies of several segments, duplicates of stored ids and
// within the batch, not_before in the future, expires_at soon, now and then
// an invalid one.
func (g *diffGen) enqueue(now time.Time) diffOp {
	op := &opEnqueue{}
	n := oneOf(g, 1, 1, 1, 1, 2, 2, 3, 4)
	for i := range n {
		if i > 0 && g.chance(0.12) {
			j := g.rng.IntN(i)
			e := copyEnvelope(op.envs[j])
			if e.Template == envelope.TemplateReply && g.chance(0.5) {
				e.Payload = mustJSON(envelope.ReplyPayload{Text: "another text"})
			}
			op.envs = append(op.envs, e)
			op.descs = append(op.descs, "again "+op.descs[j])
			continue
		}
		e, d := g.envelope(now)
		op.envs = append(op.envs, e)
		op.descs = append(op.descs, d)
	}
	return op
}

func (g *diffGen) envelope(now time.Time) (*envelope.Envelope, string) {
	user := oneOf(g, diffUsers...)
	var e *envelope.Envelope
	var desc string
	switch g.rng.IntN(10) {
	case 0, 1:
		e, desc = Digest(g.id("d"), user), "digest"
		if g.chance(0.3) {
			e.Recipient.Email = diffSharedEmail
			desc += " (shared address)"
		}
	case 2, 3:
		e, desc = Nudge(g.id("n"), user), "nudge"
		if g.chance(0.3) {
			e.Recipient.PushSubscription.Endpoint = EndpointOf(user + "/second-device")
			desc += " (second device)"
		}
	case 4, 5, 6:
		e, desc = Reply(g.id("r"), user, "hello"), "reply"
	default:
		texts := replyTexts()
		k := g.rng.IntN(len(texts))
		e, desc = Reply(g.id("L"), user, texts[k]), fmt.Sprintf("reply of %d segments", k+2)
	}
	switch t := oneOf(g, diffTenants...); {
	case t == "acme":
		e.TenantID = "acme"
	case t == envelope.DefaultTenant && g.chance(0.3):
		e.TenantID = envelope.DefaultTenant
	}
	if g.chance(0.2) {
		e.NotBefore = now.Add(oneOf(g, 30*time.Second, 2*time.Minute, time.Hour))
	} else if g.chance(0.05) {
		e.NotBefore = now.Add(-time.Hour)
	}
	if g.chance(0.2) {
		from := now
		if e.NotBefore.After(now) {
			from = e.NotBefore
		}
		e.ExpiresAt = from.Add(oneOf(g, 5*time.Second, time.Minute, 5*time.Minute, 2*time.Hour))
	}
	if g.chance(0.04) {
		switch g.rng.IntN(3) {
		case 0:
			e = Digest(e.ID, user)
			sections := DigestItems()
			sections[1].Items[0].DeepLink = ""
			e.Payload = mustJSON(envelope.DigestPayload{Sections: sections})
			desc = "digest INVALID (moat rule)"
		case 1:
			e.NotBefore, e.ExpiresAt = now.Add(time.Minute), now.Add(30*time.Second)
			desc += " INVALID (expires before not_before)"
		default:
			e.UserID = ""
			desc += " INVALID (no user_id)"
		}
	}
	desc = fmt.Sprintf("%s %s/%s %s", desc, e.Tenant(), e.ID, e.UserID)
	if !e.NotBefore.IsZero() {
		desc += " not_before=" + at(e.NotBefore)
	}
	if !e.ExpiresAt.IsZero() {
		desc += " expires_at=" + at(e.ExpiresAt)
	}
	return e, desc
}

// id returns one of the run's ids of a kind ("r-1" … "r-<ids>").
func (g *diffGen) id(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, 1+g.rng.IntN(g.ids))
}

func (g *diffGen) suppression(user string, now time.Time) queue.Suppression {
	s := queue.Suppression{
		Channel: oneOf(g, envelope.Channels...),
		Reason:  oneOf(g, envelope.ClassUnsubscribed, envelope.ClassBounced, envelope.ClassComplaint, envelope.ClassBlockedByUser, envelope.ClassSubscriptionGone),
	}
	if g.chance(0.6) {
		switch s.Channel {
		case envelope.ChannelEmail:
			s.Target = queue.TargetOf(Digest("x", user))
		case envelope.ChannelPush:
			n := Nudge("x", user)
			if g.chance(0.4) {
				n.Recipient.PushSubscription.Endpoint = EndpointOf(user + "/second-device")
			}
			s.Target = queue.TargetOf(n)
		default:
			s.Target = queue.TargetOf(Reply("x", user, "x"))
		}
	}
	if g.chance(0.5) {
		s.At = now.Add(-time.Minute)
	}
	return s
}

func (g *diffGen) claim(recover bool) diffOp {
	req := queue.ClaimRequest{
		Owner: oneOf(g, "w-1", "w-2"),
		Lease: oneOf(g, 10*time.Second, 30*time.Second, 2*time.Minute),
		Limit: oneOf(g, 0, 1, 1, 2, 3, 5, 10),
	}
	if recover {
		req.Owner = "rescuer"
		req.Limit = oneOf(g, 0, 1, 2, 10)
	} else {
		req.ExpireToPending = g.chance(g.e2p)
	}
	if g.chance(0.3) {
		req.Tenant = oneOf(g, envelope.DefaultTenant, "acme")
	}
	if g.chance(0.3) {
		for _, ch := range envelope.Channels {
			if g.chance(0.5) {
				req.Channels = append(req.Channels, ch)
			}
		}
	}
	if g.chance(0.03) {
		if g.chance(0.5) {
			req.Owner = ""
		} else {
			req.Lease = 0
		}
	}
	return &opClaim{req: req, recover: recover}
}

// lease picks a lease the model returned: with probability live one that
// still holds its row, otherwise any (mostly stale), now and then with
// another owner.
func (g *diffGen) lease(r *diffRun, live float64) (leaseRef, bool) {
	mp := r.parties[0]
	var all, holding []leaseRef
	keys := make([]envelope.Key, 0, len(mp.leases))
	for k := range mp.leases {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b envelope.Key) int { return strings.Compare(a.String(), b.String()) })
	for _, k := range keys {
		for i, l := range mp.leases[k] {
			ref := leaseRef{key: k, nth: i}
			all = append(all, ref)
			if e, ok := r.model.envs[pair{k.Tenant, k.EnvelopeID}]; ok && k.Segment < len(e.rows) {
				row := e.rows[k.Segment]
				if row.state == envelope.StateSending && row.fence == l.Fence && row.owner == l.Owner {
					holding = append(holding, ref)
				}
			}
		}
	}
	if len(all) == 0 {
		return leaseRef{}, false
	}
	ref := oneOf(g, all...)
	if len(holding) > 0 && g.chance(live) {
		ref = oneOf(g, holding...)
	}
	ref.forged = g.chance(0.04)
	return ref, true
}

func (g *diffGen) outcome() queue.Outcome {
	var o queue.Outcome
	if g.chance(g.retry) {
		o = queue.Outcome{State: envelope.StateRetryable, Class: oneOf(g, envelope.ClassTimeout, envelope.ClassRateLimited, envelope.ClassProviderUnavailable)}
		if g.chance(0.3) {
			o.RetryAfter = oneOf(g, time.Second, 5*time.Second, 30*time.Second, 2*time.Minute)
		}
		if g.chance(0.15) {
			o.Class, o.NoAttempt = envelope.ClassReconcileRejected, true
		}
		return o
	}
	switch n := g.rng.IntN(100); {
	case n < 40:
		o = queue.Outcome{State: envelope.StateSent, Receipt: fmt.Sprintf("rc-%d", g.rng.IntN(1000))}
	case n < 60:
		o = queue.Outcome{State: envelope.StateRetryable, Class: oneOf(g, envelope.ClassTimeout, envelope.ClassRateLimited, envelope.ClassProviderUnavailable)}
		if g.chance(0.3) {
			o.RetryAfter = oneOf(g, time.Second, 5*time.Second, 30*time.Second, 2*time.Minute)
		}
		if g.chance(0.15) {
			o.Class, o.NoAttempt = envelope.ClassReconcileRejected, true
		}
	case n < 68:
		o = queue.Outcome{State: envelope.StateDeadLetter, Class: oneOf(g, envelope.ClassInvalidRequest, envelope.ClassPayloadTooLarge, envelope.ClassAuthFailed)}
	case n < 73:
		o = queue.Outcome{State: envelope.StateBounced, Class: oneOf(g, "", envelope.ClassBounced, envelope.ClassSubscriptionGone, envelope.ClassInvalidRecipient)}
	case n < 77:
		o = queue.Outcome{State: envelope.StateComplaint, Class: oneOf(g, "", envelope.ClassComplaint)}
	case n < 82:
		o = queue.Outcome{State: envelope.StateSuppressed, Class: oneOf(g, "", envelope.ClassUnsubscribed, envelope.ClassBlockedByUser)}
	case n < 90:
		o = queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown}
	case n < 97:
		o = queue.Outcome{State: envelope.StateExpired, Class: oneOf(g, envelope.ClassExpired, "")}
	default:
		o = queue.Outcome{State: oneOf[envelope.State](g, envelope.StatePending, envelope.StateSending, "bogus")}
	}
	return o
}

// operator picks a Requeue or Resolve target: mostly an envelope with a
// segment it applies to, else any id seen (also gone ones) or an unknown
// one.
func (g *diffGen) operator(r *diffRun, kind string) diffOp {
	want := func(st envelope.State) bool {
		if kind == "resolve" {
			return st == envelope.StateUnresolved
		}
		switch st {
		case envelope.StateDeadLetter, envelope.StateUnresolved, envelope.StateExpired, envelope.StateSuppressed:
			return true
		}
		return false
	}
	var fit []pair
	for _, k := range sortedPairs(r.ids) {
		if e, ok := r.model.envs[k]; ok && slices.ContainsFunc(e.rows, func(x *mrow) bool { return want(x.state) }) {
			fit = append(fit, k)
		}
	}
	ids := sortedPairs(r.ids)
	var k pair
	switch {
	case len(fit) > 0 && g.chance(0.7):
		k = oneOf(g, fit...)
	case len(ids) > 0 && g.chance(0.9):
		k = oneOf(g, ids...)
	default:
		k = pair{oneOf(g, envelope.DefaultTenant, "acme"), "no-such-id"}
	}
	// A requeue that consent still refuses is refused; half the time,
	// grant the user's consent first, so that requeues of suppressed
	// envelopes also go through.
	if e, ok := r.model.envs[k]; ok && kind == "requeue" && !slices.Contains(g.excluded, "consent") && g.chance(0.5) {
		if ok, _ := r.model.allows(e.env); !ok {
			return &opAdmin{what: "consent", tenant: k.a, id: e.env.UserID,
				flags: queue.ConsentFlags{DigestEnabled: true, PushEnabled: true, EmailVerified: true, Cadence: "weekly"}}
		}
	}
	op := &opAdmin{what: kind, tenant: g.tenantName(k.a), id: k.b}
	if kind == "resolve" {
		op.as = oneOf(g, envelope.StateSent, envelope.StateSent, envelope.StateRetryable, envelope.StateRetryable, envelope.StateDeadLetter, "")
	}
	return op
}
