package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/prometheus/client_golang/prometheus"
)

// Outcome label values of outbox_deliveries_total beyond the row states.
const (
	outcomeReleased = "released"
)

// Outcome label values of outbox_provider_call_seconds.
const (
	callSent          = "sent"
	callRetryable     = "retryable"
	callPermanent     = "permanent"
	callRecipientGone = "recipient_gone"
	callPanic         = "panic"
	callLost          = "lost"        // the outcome is unknown (timeout): left for reconciliation
	callInterrupted   = "interrupted" // cancelled by shutdown: left for reconciliation
	callAccepted      = "accepted"    // reconcile answers
	callRejected      = "rejected"
	callUnknown       = "unknown"
)

// depthRefresh is how long queue_depth values are reused between scrapes.
const depthRefresh = 5 * time.Second

// metrics holds the worker's collectors. Labels are only channel, outcome,
// class, result and state: never a tenant, user or id.
type metrics struct {
	claims       *prometheus.CounterVec   // channel
	deliveries   *prometheus.CounterVec   // channel, outcome
	retries      *prometheus.CounterVec   // channel, class
	deadLetters  *prometheus.CounterVec   // channel, class
	recoveries   *prometheus.CounterVec   // result
	latency      *prometheus.HistogramVec // channel
	providerCall *prometheus.HistogramVec // channel, outcome
	panics       *prometheus.CounterVec   // channel
	unconfigured *prometheus.GaugeVec     // channel
	paused       *prometheus.GaugeVec     // channel
	depth        *depthCollector          // state
}

func newMetrics(reg prometheus.Registerer, depth func(context.Context) (queue.Counts, error)) (*metrics, error) {
	m := &metrics{
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_claims_total",
			Help: "Rows leased by the worker for delivery.",
		}, []string{"channel"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_deliveries_total",
			Help: "Delivery outcomes committed (or releases) by the worker, by channel and outcome.",
		}, []string{"channel", "outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_retries_total",
			Help: "Deliveries scheduled for a retry, by channel and stable error class.",
		}, []string{"channel", "class"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_dead_letters_total",
			Help: "Deliveries moved to dead_letter, by channel and stable error class.",
		}, []string{"channel", "class"}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_lease_recoveries_total",
			Help: "Expired leases reconciled with the provider, by result (accepted, rejected, unknown).",
		}, []string{"result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_delivery_latency_seconds",
			Help:    "Time from enqueue to sent.",
			Buckets: prometheus.ExponentialBuckets(0.05, 4, 11), // 50ms … ~14.5h
		}, []string{"channel"}),
		providerCall: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_provider_call_seconds",
			Help:    "Duration of provider Deliver and Reconcile calls, by channel and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10), // 5ms … ~19s
		}, []string{"channel", "outcome"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_panics_total",
			Help: "Provider (or renderer) panics recovered by the worker.",
		}, []string{"channel"}),
		unconfigured: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outbox_channel_unconfigured",
			Help: "1 when a channel has no provider: its rows stay pending.",
		}, []string{"channel"}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outbox_channel_paused",
			Help: "1 while a channel is paused because its provider refused the credentials (auth_failed): its rows stay pending.",
		}, []string{"channel"}),
		depth: &depthCollector{
			desc: prometheus.NewDesc("outbox_queue_depth",
				"Rows in the queue by state (refreshed at most every few seconds).",
				[]string{"state"}, nil),
			counts: depth,
		},
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.claims, err = register(reg, m.claims); err != nil {
		return nil, err
	}
	if m.deliveries, err = register(reg, m.deliveries); err != nil {
		return nil, err
	}
	if m.retries, err = register(reg, m.retries); err != nil {
		return nil, err
	}
	if m.deadLetters, err = register(reg, m.deadLetters); err != nil {
		return nil, err
	}
	if m.recoveries, err = register(reg, m.recoveries); err != nil {
		return nil, err
	}
	if m.latency, err = register(reg, m.latency); err != nil {
		return nil, err
	}
	if m.providerCall, err = register(reg, m.providerCall); err != nil {
		return nil, err
	}
	if m.panics, err = register(reg, m.panics); err != nil {
		return nil, err
	}
	if m.unconfigured, err = register(reg, m.unconfigured); err != nil {
		return nil, err
	}
	if m.paused, err = register(reg, m.paused); err != nil {
		return nil, err
	}
	if m.depth, err = register(reg, m.depth); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c on reg, or returns the collector already registered
// under the same descriptors (several workers sharing one registry).
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	var zero T
	return zero, err
}

// depthCollector exports outbox_queue_depth{state} from Store.Counts,
// refreshed on scrape at most every depthRefresh.
type depthCollector struct {
	desc   *prometheus.Desc
	counts func(context.Context) (queue.Counts, error)

	mu   sync.Mutex
	at   time.Time
	last queue.Counts
}

// Describe implements prometheus.Collector.
func (d *depthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

// Collect implements prometheus.Collector.
func (d *depthCollector) Collect(ch chan<- prometheus.Metric) {
	d.mu.Lock()
	if d.last == nil || time.Since(d.at) >= depthRefresh {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := d.counts(ctx)
		cancel()
		if err == nil {
			d.last, d.at = c, time.Now()
		}
	}
	counts := d.last
	d.mu.Unlock()
	if counts == nil {
		return
	}
	for _, s := range envelope.States {
		ch <- prometheus.MustNewConstMetric(d.desc, prometheus.GaugeValue, float64(counts.Total(s)), string(s))
	}
}
