package pgstore

import (
	"github.com/outboxhq/outbox/queue"
	"github.com/prometheus/client_golang/prometheus"
)

// storeMetrics are the counters every store keeps and the PostgreSQL
// store's own.
type storeMetrics struct {
	*queue.Metrics
	listenReconnects prometheus.Counter
}

func newStoreMetrics(reg prometheus.Registerer) *storeMetrics {
	m := &storeMetrics{
		listenReconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_pg_listen_reconnects_total", Help: "Times the PostgreSQL store's LISTEN connection was lost and opened again.",
		}),
	}
	m.Metrics = queue.NewMetrics(reg, m.listenReconnects)
	return m
}
