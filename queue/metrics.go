package queue

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the counters every store keeps, under one set of names, so
// that dashboards and alert rules hold whichever store runs. Labels are
// low-cardinality only: never tenant, user or id.
type Metrics struct {
	Enqueued      *prometheus.CounterVec // envelopes stored, by channel
	Duplicates    prometheus.Counter     // enqueued envelopes that already existed
	EnqueueErrors prometheus.Counter     // enqueues the store failed (not refusals)
	SeamExpired   prometheus.Counter     // external workers' leases that expired
}

// NewMetrics makes the shared counters and registers them and the store's
// own collectors on reg (nothing is registered when reg is nil; a
// collector already registered there is left as it is).
func NewMetrics(reg prometheus.Registerer, own ...prometheus.Collector) *Metrics {
	m := &Metrics{
		Enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_enqueued_total", Help: "Envelopes stored, by channel.",
		}, []string{"channel"}),
		Duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_enqueue_duplicates_total", Help: "Enqueued envelopes that already existed.",
		}),
		EnqueueErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_enqueue_errors_total", Help: "Enqueues that failed in the store (a log append, a database transaction); not refusals of invalid envelopes or by consent.",
		}),
		SeamExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_seam_leases_expired_total", Help: "Leases of external workers that expired and returned their rows to pending.",
		}),
	}
	if reg != nil {
		for _, c := range append([]prometheus.Collector{m.Enqueued, m.Duplicates, m.EnqueueErrors, m.SeamExpired}, own...) {
			_ = reg.Register(c)
		}
	}
	return m
}
