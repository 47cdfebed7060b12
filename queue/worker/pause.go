package worker

import (
	"sync"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// A channel whose provider serves every row from one service
// (Capabilities.OneService) and refused the credentials (auth_failed: a
// revoked or mistyped token, rotated keys) or could not be reached at all
// (provider_unreachable: its name does not resolve, the connection is
// refused, this host's network is down) is paused. The row that met it
// ends as the class says (auth_failed: dead_letter, as every permanent
// error; unreachable: retryable, its attempt given back, for nothing was
// sent), but the rest of the channel's backlog is not claimed, each of
// which would have gone the same way: it waits while the pause lasts, and
// then one row at a time is tried. A delivery that goes through lifts the
// pause; another failure of the same class doubles it, up to its maximum.
var pauseLengths = map[envelope.ErrorClass]struct{ min, max time.Duration }{
	envelope.ClassAuthFailed:  {time.Minute, 30 * time.Minute},
	envelope.ClassUnreachable: {5 * time.Second, 5 * time.Minute},
}

// pauseMin and pauseMax are auth_failed's.
var (
	pauseMin = pauseLengths[envelope.ClassAuthFailed].min
	pauseMax = pauseLengths[envelope.ClassAuthFailed].max
)

// pausing reports whether class pauses its channel.
func pausing(class envelope.ErrorClass) bool {
	_, ok := pauseLengths[class]
	return ok
}

type pauses struct {
	mu sync.Mutex
	m  map[envelope.Channel]*pause
}

type pause struct {
	class  envelope.ErrorClass
	until  time.Time
	length time.Duration
	probe  *envelope.Key // the one row tried after the pause, in flight
}

// refused records a failure of ch with a pausing class at now. It returns
// the pause's length when it starts or doubles one (a probe's failure),
// 0 when a delivery that was in flight as the pause began failed the same
// way; and when the pause ends.
func (p *pauses) refused(ch envelope.Channel, class envelope.ErrorClass, now time.Time) (time.Duration, time.Time) {
	lengths := pauseLengths[class]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[envelope.Channel]*pause{}
	}
	ps := p.m[ch]
	switch {
	case ps == nil || ps.class != class:
		ps = &pause{class: class, length: lengths.min}
		p.m[ch] = ps
	case now.Before(ps.until):
		return 0, ps.until
	default:
		ps.length = min(2*ps.length, lengths.max)
	}
	ps.until, ps.probe = now.Add(ps.length), nil
	return ps.length, ps.until
}

// accepted lifts ch's pause; it reports whether there was one.
func (p *pauses) accepted(ch envelope.Channel) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.m[ch]
	delete(p.m, ch)
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
