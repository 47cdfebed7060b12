package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

func init() {
	register(&command{Name: "doctor", Short: "check that index and logs agree; rebuild the index from the logs when it is lost or corrupt (PostgreSQL: schema version and rows to look at)", Run: runDoctor})
	register(&command{Name: "compact", Short: "prune terminal rows past retention and compact the index file", Run: runCompact})
	register(&command{Name: "path", Short: "print the append log path of a user (for foreign appenders)", Run: runPath})
}

func runDoctor(ctx context.Context, e *env, args []string) int {
	s := newSettings("doctor", e)
	s.usage("Usage: outbox doctor [--rebuild] [--after-restore] [--json]\n\nChecks the store in --data: bbolt's own consistency, every log offset and\nrecord against its index entry, every row against the due and lease indexes,\nthe consent journal against the index.\nWhen the index file is missing or cannot be opened it is rebuilt from the\nlogs and the consent journal (the broken file is kept as index.db.broken-TIME);\n--rebuild forces that. Consent, suppressions and push subscriptions come back\nfrom the journal. Rebuilt rows whose fate is unknown become unresolved, never\nredelivered automatically. Works through a running serve (check only).\nWith --database-url: connects, compares the schema's version with this\noutbox's, counts the rows that need an operator or a reconciler, and says\nwhether the database is older than the one serve last used here (restored\nfrom a backup: --after-restore makes the deliveries of unknown fate\nunresolved, so that none is sent twice).\n--after-restore on a data directory restored from a copy does the same\nthere: what waited when the copy was taken becomes unresolved, what had\nended stays (a rebuild would make every row unresolved).\n\nFlags:\n")
	data := dataFlag(s)
	db := addDBFlags(s)
	rebuild := s.fs.Bool("rebuild", false, "rebuild the index from the logs (stop outbox serve first)")
	afterRestore := s.fs.Bool("after-restore", false, "the data directory or the database was restored from a backup; make every delivery of unknown fate unresolved (stop every serve first)")
	js := s.fs.Bool("json", false, "print the report as JSON")
	if code, done := s.parse(args); done {
		return code
	}
	if dsn, err := db.dsn(e); err != nil {
		return fail(e, "%v", err)
	} else if dsn != "" {
		if *rebuild {
			return fileOnly(e, "doctor --rebuild")
		}
		return pgDoctor(ctx, e, dsn, *db.schema, *data, *afterRestore, *js)
	}
	if _, err := os.Stat(*data); err != nil {
		return fail(e, "no data directory %s", *data)
	}
	if err := fileStoreDir(*data); err != nil {
		return fail(e, "%v", err)
	}
	sockUp := socketUp(*data)
	if *afterRestore {
		if *rebuild {
			return fail(e, "--after-restore and --rebuild exclude each other: a rebuild makes every row unresolved already")
		}
		if sockUp {
			return fail(e, "outbox serve is running on %s: stop it before --after-restore", *data)
		}
		if err := checkOwner(*data); err != nil {
			return fail(e, "%v", err)
		}
		q, err := filestore.Open(*data, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
		if err != nil {
			return fail(e, "%v", err)
		}
		n, err := q.AfterRestore(ctx)
		if cerr := q.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(e, "after restore: %v (run it again: it goes on where it stopped)", err)
		}
		fmt.Fprintln(e.Stdout, afterRestoreLine(n))
	}
	if *rebuild && !sockUp {
		if err := checkOwner(*data); err != nil {
			return fail(e, "%v", err)
		}
	}
	idx := filepath.Join(*data, filestore.IndexFile)
	fi, statErr := os.Stat(idx)
	var rep *filestore.Report
	var err error
	if !*rebuild && !sockUp && neverOpened(*data) && (statErr != nil || fi.Size() == 0) {
		// Only appended to (outbox enqueue, a foreign appender): what serve
		// would do is index the records as new work, not rebuild them as
		// rows of unknown fate.
		fmt.Fprintln(e.Stdout, "no index yet (the store was never opened): indexing the logs' records as new work, as outbox serve does")
		if err := checkOwner(*data); err != nil {
			return fail(e, "%v", err)
		}
		q, err := filestore.Open(*data, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
		if err != nil {
			return fail(e, "%v", err)
		}
		if err := q.Close(); err != nil {
			return fail(e, "%v", err)
		}
		_, statErr = os.Stat(idx)
	}
	switch {
	case *rebuild && sockUp:
		return fail(e, "outbox serve is running on %s: stop it before --rebuild", *data)
	case sockUp:
		b, closeFn, err2 := openBackend(*data)
		if err2 != nil {
			return fail(e, "%v", err2)
		}
		defer closeFn()
		rep, err = b.Check(ctx)
	case !*rebuild && statErr == nil:
		rep, err = filestore.Check(*data)
	case !*rebuild && !errors.Is(statErr, os.ErrNotExist):
		err = fmt.Errorf("cannot look at the index: %w", statErr) // not a missing one: nothing to rebuild
	}
	if err != nil {
		return fail(e, "%v", err)
	}
	broken := rep != nil && !rep.OK() && len(rep.Problems) > 0 && isOpenFailure(rep)
	if *rebuild || errors.Is(statErr, os.ErrNotExist) || broken {
		why := "--rebuild"
		switch {
		case errors.Is(statErr, os.ErrNotExist):
			why = "the index file is missing"
		case broken:
			why = "the index cannot be used (" + rep.Problems[0] + ")"
		}
		fmt.Fprintf(e.Stdout, "rebuilding the index from the logs and the consent journal: %s\n", why)
		if err := checkOwner(*data); err != nil {
			return fail(e, "%v", err)
		}
		n, err := filestore.Rebuild(*data, nil)
		if err != nil {
			return fail(e, "%v", err)
		}
		fmt.Fprintf(e.Stdout, "rebuilt: %d envelopes indexed; rows of unknown fate are unresolved (outbox ls --state unresolved; outbox resolve --all --class index_rebuilt --as sent|retry settles them all, outbox resolve ID one)\n", n)
		if rep, err = filestore.Check(*data); err != nil {
			return fail(e, "%v", err)
		}
	}
	if *js {
		printJSON(e, rep)
	} else {
		fmt.Fprintf(e.Stdout, "logs %d, envelopes %d, rows %d, quarantined lines %d, unindexed bytes %d, consent journal records %d (bytes not applied yet %d)\n",
			rep.Logs, rep.Envelopes, rep.Rows, rep.Quarantined, rep.Unindexed, rep.Journal, rep.JournalUnapplied)
		if rep.FreeInodes != nil {
			fmt.Fprintf(e.Stdout, "file system: %s free, %d inodes free\n", humanBytes(rep.FreeBytes), *rep.FreeInodes)
		} else {
			fmt.Fprintf(e.Stdout, "file system: %s free\n", humanBytes(rep.FreeBytes))
		}
		if rep.WentBack != "" {
			fmt.Fprintln(e.Stdout, "note:", rep.WentBack)
		}
		for _, n := range rep.Settled {
			fmt.Fprintln(e.Stdout, "note:", n)
		}
		for _, p := range rep.Problems {
			fmt.Fprintln(e.Stdout, "problem:", p)
		}
	}
	if !rep.OK() {
		fmt.Fprintln(e.Stderr, "Error: "+doctorAdvice(rep.Problems))
		return exitFailure
	}
	if !*js {
		fmt.Fprintln(e.Stdout, "ok")
	}
	return exitOK
}

// afterRestoreLine is what doctor --after-restore prints on either store.
func afterRestoreLine(n int) string {
	return fmt.Sprintf("after restore: %d envelopes had deliveries of unknown fate: they are unresolved (outbox ls --state unresolved; outbox resolve --all --class database_restored --as sent|retry settles them all, outbox resolve ID one)", n)
}

func isOpenFailure(rep *filestore.Report) bool {
	for _, p := range rep.Problems {
		if len(p) >= 5 && (p[:5] == "index") {
			return true
		}
	}
	return false
}

// socketUp reports whether an outbox serve answers on dir's operator
// socket. It only dials the socket: opening the store to find out (as
// openBackend does without one) would index the logs first, and doctor
// would then check a store that had already caught up with a truncated or
// replaced log instead of reporting it.
func socketUp(dir string) bool {
	path, err := operatorSocket(dir)
	if err != nil {
		return false // a link: never dialled (opening the store then meets the lock of a running serve)
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func runCompact(ctx context.Context, e *env, args []string) int {
	s := newSettings("compact", e)
	s.usage("Usage: outbox compact\n\nPrunes terminal rows older than the retention period, removes logs left\nempty, rewrites logs that pruned records fill for the most part, and (when\noutbox serve is not running) rewrites the index file compactly.\n\nFlags:\n")
	data := dataFlag(s)
	db := addDBFlags(s)
	retention := s.duration("retention", "OUTBOX_RETENTION", queue.DefaultRetention, "how long terminal rows are kept")
	rewriteMin := logRewriteFlag(s)
	if code, done := s.parse(args); done {
		return code
	}
	if dsn, err := db.dsn(e); err != nil {
		return fail(e, "%v", err)
	} else if dsn != "" {
		return fileOnly(e, "compact (serve prunes PostgreSQL every hour; VACUUM is the server's)")
	}
	if err := fileStoreDir(*data); err != nil {
		return fail(e, "%v", err)
	}
	if socketUp(*data) {
		b, closeFn, err := openBackend(*data)
		if err != nil {
			return fail(e, "%v", err)
		}
		defer closeFn()
		n, err := b.Prune(ctx)
		if err != nil {
			return fail(e, "%v", err)
		}
		fmt.Fprintf(e.Stdout, "pruned %d envelopes (outbox serve is running: stop it to compact the index file)\n", n)
		return exitOK
	}
	if err := checkOwner(*data); err != nil {
		return fail(e, "%v", err)
	}
	// One lock from the prune to the swap of the compacted file: a serve
	// starting meanwhile fails with "in use" instead of opening the old
	// file.
	n, before, after, err := filestore.Compact(ctx, *data, &filestore.Options{Options: queue.Options{Retention: *retention}, LogRewriteMin: int64(*rewriteMin)})
	if err != nil {
		return fail(e, "%v", err)
	}
	fmt.Fprintf(e.Stdout, "pruned %d envelopes; index %d → %d bytes\n", n, before, after)
	return exitOK
}

func runPath(ctx context.Context, e *env, args []string) int {
	s := newSettings("path", e)
	s.usage("Usage: outbox path --user USER [--tenant T]\n\nPrints the append log a foreign appender writes to for that user.\n\nFlags:\n")
	data := dataFlag(s)
	db := addDBFlags(s)
	tenant := tenantFlag(s)
	user := s.fs.String("user", "", "user id")
	if code, done := s.parse(args); done {
		return code
	}
	if dsn, err := db.dsn(e); err != nil {
		return fail(e, "%v", err)
	} else if dsn != "" {
		return fileOnly(e, "path (append logs)")
	}
	if err := fileStoreDir(*data); err != nil {
		return fail(e, "%v", err)
	}
	if *user == "" {
		fmt.Fprintln(e.Stderr, "Error: --user is required")
		return exitUsage
	}
	fmt.Fprintln(e.Stdout, filestore.LogPath(*data, *tenant, *user))
	return exitOK
}

// doctorAdvice is doctor's closing line for problems it found. A rebuild
// helps only the index itself: records gone from the logs cannot come back
// from one, and it would make every row, sent ones too, unresolved.
// Nor does it help the consent journal: it reads the journal, and would
// lose the facts that only the index holds.
func doctorAdvice(problems []string) string {
	logs, files := false, false
	for _, p := range problems {
		switch {
		case strings.HasPrefix(p, "journal "):
		case strings.HasPrefix(p, "log "), strings.HasPrefix(p, "envelope record "):
			logs = true
		case p == filestore.ReadOnlyProblem, p == filestore.NoSpaceProblem, p == filestore.NoInodesProblem,
			strings.HasSuffix(p, "chown it to the store's user"):
			files = true
		default:
			return "the store has problems; outbox doctor --rebuild rebuilds the index from the logs and the consent journal"
		}
	}
	if files && !logs {
		return "the store's files cannot be used as they are (see above): make the file system writable, free space or inodes, or give the files back to the store's user; the index is fine, so do not rebuild for these"
	}
	if !logs {
		return "the store's consent journal has problems (see the hints above); a rebuild reads the journal and would lose what it lacks, so do not rebuild for these"
	}
	return "the store has problems in its logs (see the hints above); a rebuild cannot bring back records that are gone from them, and their rows end dead_letter (record_lost) when claimed, so do not rebuild for these (unresolved ones are never claimed: settle them with outbox resolve, and doctor stops listing them once every row of theirs has ended)"
}

// neverOpened reports whether the store in dir never had an index: no
// stamp (filestore.StampFile), though its logs may hold appended records.
func neverOpened(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, filestore.StampFile))
	return errors.Is(err, os.ErrNotExist)
}

// humanBytes is n in the largest binary unit that keeps it at least 1.
func humanBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/1024, 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, units[i])
}
