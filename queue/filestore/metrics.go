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
	// logCompactions counts logs rewritten without their pruned records.
	logCompactions prometheus.Counter
}

func newStoreMetrics(reg prometheus.Registerer, dir string) *storeMetrics {
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
		logCompactions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_log_compactions_total", Help: "Logs rewritten without their pruned records, after a prune.",
		}),
	}
	m.Metrics = queue.NewMetrics(reg, m.ingested, m.quarantined, m.logResets, m.logCompactions,
		spaceGauge(dir, "space", func(sp space) float64 { return ratio(sp.bytes, sp.totalBytes) }),
		spaceGauge(dir, "inodes", func(sp space) float64 { return ratio(sp.inodes, sp.totalInodes) }))
	return m
}

// spaceGauge is the share of the data directory's file system still free
// (read at each scrape): enqueues fail with 507 storage_full at 0, of
// space, or of inodes for a user without a log. It reads 1 on a file
// system that does not count inodes.
func spaceGauge(dir, resource string, share func(space) float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "outbox_storage_free_ratio",
		Help:        "Share of the data directory's file system still free for the store, of space or of inodes (resource).",
		ConstLabels: prometheus.Labels{"resource": resource},
	}, func() float64 {
		sp, ok := freeSpace(dir)
		if !ok {
			return 0
		}
		return share(sp)
	})
}

func ratio(free, total uint64) float64 {
	if total == 0 {
		return 1
	}
	return float64(free) / float64(total)
}
