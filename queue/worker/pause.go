package worker

import (
	"sync"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// A channel whose provider serves every row from one service
// (Capabilities.OneService) is paused when the service refuses the
// credentials (auth_failed: a revoked or mistyped token, rotated keys),
// cannot be reached at all (provider_unreachable: its name does not
// resolve, the connection is refused, this host's network is down), or
// fails three calls in a row (provider_unavailable, network_error,
// timeout: an outage). The rows that met it end as their class says
// (auth_failed: dead_letter, as every permanent error; unreachable:
// retryable, the attempt given back, for nothing was sent; an outage's:
// retried, or reconciled where the call may have gone through), but the
// rest of the channel's backlog is not claimed, each of which would have
// gone the same way: it waits while the pause lasts, and then one row at
// a time is tried. An answer of the service (a delivery that goes through,
// or a failure of another class) lifts the pause; another failure of the
// same class doubles it, up to its maximum.
//
// A used-up quota (quota_exceeded: Resend's daily or monthly sending
// limit) pauses the channel until the provider's Retry-After (the quota's
// reset), and, as nothing was sent, gives the attempt back, like
// provider_unreachable: the backlog waits for the reset instead of being
// claimed row by row into the same answer.
var pauseRules = map[envelope.ErrorClass]struct {
	min, max time.Duration
	after    int  // failures in a row that start a pause
	giveBack bool // nothing was sent: the row's attempt is given back
}{
	envelope.ClassAuthFailed:          {time.Minute, 30 * time.Minute, 1, false},
	envelope.ClassUnreachable:         {5 * time.Second, 5 * time.Minute, 1, true},
	envelope.ClassQuotaExceeded:       {time.Minute, time.Hour, 1, true},
	envelope.ClassProviderUnavailable: {5 * time.Second, 5 * time.Minute, 3, false},
	envelope.ClassNetwork:             {5 * time.Second, 5 * time.Minute, 3, false},
	envelope.ClassTimeout:             {5 * time.Second, 5 * time.Minute, 3, false},
}

// pausing reports whether class pauses its channel.
func pausing(class envelope.ErrorClass) bool {
	_, ok := pauseRules[class]
	return ok
}

type pauses struct {
	mu     sync.Mutex
	m      map[envelope.Channel]*pause
	streak map[envelope.Channel]int // failures of pausing classes in a row
}

type pause struct {
	class  envelope.ErrorClass
	until  time.Time
	length time.Duration
	probe  *envelope.Key // the one row tried after the pause, in flight
}

// refused records a failure of ch with a pausing class at now; a pause it
// starts lasts at least floor (the provider's Retry-After). It returns the
// pause's length when it starts or doubles one (a probe's failure), 0 when
// a delivery that was in flight as the pause began failed the same way,
// or when too few failed in a row yet; and when the pause ends.
func (p *pauses) refused(ch envelope.Channel, class envelope.ErrorClass, now time.Time, floor time.Duration) (time.Duration, time.Time) {
	rule := pauseRules[class]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m, p.streak = map[envelope.Channel]*pause{}, map[envelope.Channel]int{}
	}
	p.streak[ch]++
	ps := p.m[ch]
	switch {
	case ps == nil || ps.class != class:
		if p.streak[ch] < rule.after {
			return 0, time.Time{}
		}
		ps = &pause{class: class, length: rule.min}
		p.m[ch] = ps
	case now.Before(ps.until):
		return 0, ps.until
	default:
		ps.length = min(2*ps.length, rule.max)
	}
	d := max(ps.length, floor)
	ps.until, ps.probe = now.Add(d), nil
	return d, ps.until
}

// answered lifts ch's pause (the service answered); it reports whether
// there was one.
func (p *pauses) answered(ch envelope.Channel) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.m[ch]
	delete(p.m, ch)
	delete(p.streak, ch)
	return ok
}

// done ends the delivery of key on ch: when it was the probe and told
// nothing of the credentials (a network error, an expired row, a lease
// given back), the next row is tried.
func (p *pauses) done(ch envelope.Channel, key envelope.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps := p.m[ch]; ps != nil && ps.probe != nil && *ps.probe == key {
		ps.probe = nil
	}
}

// split sorts chans at now into those claimed as usual and those paused
// whose pause is over and that have no probe in flight (claimed one row
// at a time, as probes). Channels paused, or probing, are in neither.
func (p *pauses) split(chans []envelope.Channel, now time.Time) (ready, probe []envelope.Channel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) == 0 {
		return chans, nil
	}
	ready = make([]envelope.Channel, 0, len(chans))
	for _, ch := range chans {
		switch ps := p.m[ch]; {
		case ps == nil:
			ready = append(ready, ch)
		case !now.Before(ps.until) && ps.probe == nil:
			probe = append(probe, ch)
		}
	}
	return ready, probe
}

// startProbe marks key, of ch, the probe in flight.
func (p *pauses) startProbe(ch envelope.Channel, key envelope.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps := p.m[ch]; ps != nil {
		ps.probe = &key
	}
}

// wait is how long until the first pause ends after now (0: none).
func (p *pauses) wait(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var wait time.Duration
	for _, ps := range p.m {
		if d := ps.until.Sub(now); d > 0 && (wait == 0 || d < wait) {
			wait = d
		}
	}
	return wait
}
