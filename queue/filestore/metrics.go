package filestore

import (
	"github.com/outboxhq/outbox/queue"
	"github.com/prometheus/client_golang/prometheus"
)

// storeMetrics are the counters every store keeps and the file store's
// own (the worker has its own).
type storeMetrics struct {
	*queue.Metrics
	ingested    prometheus.Counter
	quarantined prometheus.Counter
	logResets   *prometheus.CounterVec
}

func newStoreMetrics(reg prometheus.Registerer) *storeMetrics {
	m := &storeMetrics{
		ingested: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_ingested_total", Help: "Envelopes indexed from lines appended by other processes.",
		}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_quarantined_total", Help: "Complete log lines that were not valid envelopes.",
		}),
		logResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_log_resets_total", Help: "Logs found replaced, truncated or rewritten under the store and indexed again from their start, by reason.",
		}, []string{"reason"}),
	}
	m.Metrics = queue.NewMetrics(reg, m.ingested, m.quarantined, m.logResets)
	return m
}
