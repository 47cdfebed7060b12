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
	clockSkew        prometheus.Gauge
}

func newStoreMetrics(reg prometheus.Registerer) *storeMetrics {
	m := &storeMetrics{
		listenReconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_pg_listen_reconnects_total", Help: "Times the PostgreSQL store's LISTEN connection was lost and opened again.",
		}),
		clockSkew: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_pg_clock_skew_seconds", Help: "The database server's clock minus this host's, measured at start and every 5 minutes.",
		}),
	}
	m.Metrics = queue.NewMetrics(reg, m.listenReconnects, m.clockSkew)
	return m
}
