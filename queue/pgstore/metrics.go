package pgstore

import "github.com/prometheus/client_golang/prometheus"

// storeMetrics are the store's own metrics, under the file store's names
// where they mean the same. Labels are low-cardinality only: never
// tenant, user or id.
type storeMetrics struct {
	enqueued         *prometheus.CounterVec
	duplicates       prometheus.Counter
	enqueueErrors    prometheus.Counter
	seamExpired      prometheus.Counter
	listenReconnects prometheus.Counter
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
			Name: "outbox_enqueue_errors_total", Help: "Enqueues that failed in the database (not refusals of invalid envelopes or by consent).",
		}),
		seamExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_seam_leases_expired_total", Help: "Leases of external workers that expired and returned their rows to pending.",
		}),
		listenReconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_pg_listen_reconnects_total", Help: "Times the PostgreSQL store's LISTEN connection was lost and opened again.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.enqueued, m.duplicates, m.enqueueErrors, m.seamExpired, m.listenReconnects} {
			_ = reg.Register(c)
		}
	}
	return m
}
