package filestore

import "github.com/prometheus/client_golang/prometheus"

// storeMetrics are the store's own metrics (the worker has its own).
// Labels are low-cardinality only: never tenant, user or id.
type storeMetrics struct {
	enqueued      *prometheus.CounterVec
	duplicates    prometheus.Counter
	enqueueErrors prometheus.Counter
	ingested      prometheus.Counter
	quarantined   prometheus.Counter
	seamExpired   prometheus.Counter
	logResets     *prometheus.CounterVec
}

func newStoreMetrics(reg prometheus.Registerer) *storeMetrics {
	m := &storeMetrics{
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_enqueued_total", Help: "Envelopes stored, by channel.",
		}, []string{"channel"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_enqueue_duplicates_total", Help: "Enqueued envelopes that already existed.",
		}),
		enqueueErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_enqueue_errors_total", Help: "Enqueues that failed to append to a log.",
		}),
		ingested: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_ingested_total", Help: "Envelopes indexed from lines appended by other processes.",
		}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_quarantined_total", Help: "Complete log lines that were not valid envelopes.",
		}),
		seamExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_seam_leases_expired_total", Help: "Leases of external workers that expired and returned their rows to pending.",
		}),
		logResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_log_resets_total", Help: "Logs found replaced, truncated or rewritten under the store and indexed again from their start, by reason.",
		}, []string{"reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.enqueued, m.duplicates, m.enqueueErrors, m.ingested, m.quarantined, m.seamExpired, m.logResets} {
			_ = reg.Register(c)
		}
	}
	return m
}
