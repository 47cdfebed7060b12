package filestore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
)

// tailer ingests lines appended by other processes: fsnotify events are a
// hint to look again at one log, and a slow rescan of every log is the
// truth (events can be dropped, coalesced or missed for directories created
// before their watch existed).
type tailer struct {
	q     *Queue
	w     *fsnotify.Watcher
	stop  chan struct{}
	done  sync.WaitGroup
	kick  chan struct{}
	hooks atomic.Pointer[tailHooks] // set only by tests

	mu    sync.Mutex
	dirty map[string]bool
	all   bool
	// took and wait are the last full pass's duration and the wait it set
	// before the next periodic one (mu; tests read them).
	took, wait time.Duration
}

// rescanBudget is the share of the time periodic rescans may take: after
// a pass that took d, the next waits at least d/rescanBudget (the rescan
// interval otherwise). With hundreds of thousands of logs a pass takes
// seconds; the store still stays near idle, and fsnotify still wakes it
// at once for appends.
const rescanBudget = 0.01

// rescanWait returns the wait before the next periodic rescan.
func rescanWait(interval, took time.Duration) time.Duration {
	return max(interval, time.Duration(float64(took)/rescanBudget))
}

// tailHooks let tests observe the tailer; nil funcs (and a nil pointer)
// in production.
type tailHooks struct {
	scanned func() // a catch-up pass finished
	settled func() // an event for a settled log was ignored
}

func (t *tailer) hook(f func(*tailHooks) func()) {
	if h := t.hooks.Load(); h != nil {
		if fn := f(h); fn != nil {
			fn()
		}
	}
}

func newTailer(q *Queue) *tailer {
	return &tailer{q: q, stop: make(chan struct{}), kick: make(chan struct{}, 1), dirty: map[string]bool{}}
}

func (t *tailer) start() error {
	if !t.q.opts.DisableWatcher {
		w, err := fsnotify.NewWatcher()
		if err != nil {
			t.q.log.Warn("fsnotify unavailable; relying on the periodic rescan", "component", "tailer", "status", "degraded")
		} else {
			t.w = w
			root := filepath.Join(t.q.dir, applog.Dir)
			if err := w.Add(root); err != nil {
				w.Close()
				return err
			}
			entries, _ := os.ReadDir(root)
			for _, e := range entries {
				if e.IsDir() {
					_ = w.Add(filepath.Join(root, e.Name()))
				}
			}
			t.done.Add(1)
			go t.watch()
		}
	}
	t.done.Add(1)
	go t.loop()
	return nil
}

func (t *tailer) close() {
	close(t.stop)
	if t.w != nil {
		t.w.Close()
	}
	t.done.Wait()
}

func (t *tailer) mark(rel string, all bool) {
	t.mu.Lock()
	if all {
		t.all = true
	} else {
		t.dirty[rel] = true
	}
	t.mu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// watch turns fsnotify events into "look again" marks.
func (t *tailer) watch() {
	defer t.done.Done()
	for {
		select {
		case ev, ok := <-t.w.Events:
			if !ok {
				return
			}
			t.event(ev)
		case err, ok := <-t.w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				t.mark("", true)
			}
			t.q.log.Warn("fsnotify error; rescanning", "component", "tailer", "status", "degraded")
		case <-t.stop:
			return
		}
	}
}

// event marks what one fsnotify event asks to look at again.
func (t *tailer) event(ev fsnotify.Event) {
	root := filepath.Join(t.q.dir, applog.Dir)
	rel, err := filepath.Rel(t.q.dir, ev.Name)
	if err != nil {
		return
	}
	if filepath.Dir(ev.Name) == root {
		// A new tenant directory: watch it and look at all of it (files
		// may exist before the watch did).
		if ev.Has(fsnotify.Create) {
			// Lstat: a link to a directory elsewhere is neither watched
			// nor followed (the rescan reports it).
			if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
				_ = t.w.Add(ev.Name)
				t.mark("", true)
			}
		}
		return
	}
	if !strings.HasSuffix(rel, applog.Ext) || !(ev.Has(fsnotify.Write) || ev.Has(fsnotify.Create)) {
		return
	}
	// Most events are this process's own appends, indexed by their
	// Enqueue: only logs changed since are read.
	if !t.q.app.Settled(rel) {
		t.mark(rel, false)
		return
	}
	t.hook(func(h *tailHooks) func() { return h.settled })
}

// loop catches up marked logs, and every log on each rescan tick.
func (t *tailer) loop() {
	defer t.done.Done()
	var tick <-chan time.Time
	var timer *time.Timer
	if t.q.opts.RescanInterval > 0 {
		timer = time.NewTimer(t.q.opts.RescanInterval)
		defer timer.Stop()
		tick = timer.C
	}
	check := time.NewTicker(indexCheckInterval)
	defer check.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-check.C:
			t.q.checkIndexFile()
			continue
		case <-tick:
			t.mark("", true)
			continue
		case <-t.kick:
		}
		t.mu.Lock()
		all, dirty := t.all, t.dirty
		t.all, t.dirty = false, map[string]bool{}
		t.mu.Unlock()
		var err error
		if all {
			start := time.Now()
			err = t.q.catchUpAll(false)
			if timer != nil {
				took := time.Since(start)
				wait := rescanWait(t.q.opts.RescanInterval, took)
				t.mu.Lock()
				t.took, t.wait = took, wait
				t.mu.Unlock()
				timer.Reset(wait)
			}
		} else {
			// Settled again since it was marked: nothing to read.
			for rel := range dirty {
				if t.q.app.Settled(rel) {
					delete(dirty, rel)
				}
			}
			if len(dirty) > 0 {
				err = t.q.write(context.Background(), true, func(tx *bolt.Tx) error {
					for rel := range dirty {
						if err := t.q.catchUp(tx, rel, nil, nil); err != nil {
							return err
						}
					}
					return nil
				})
			}
		}
		if err != nil && !errors.Is(err, queue.ErrClosed) {
			t.q.log.Error("ingest failed", "component", "tailer", "operation", "ingest", "status", "error")
		}
		t.q.wake()
		t.hook(func(h *tailHooks) func() { return h.scanned })
	}
}

// Rescan asks the tailer to look at every log now.
func (q *Queue) Rescan() {
	if q.tail != nil {
		q.tail.mark("", true)
	}
}
