package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

// backend is what the operator commands need. It is served by the store
// opened directly, or, while outbox serve runs, by the daemon over its
// operator socket.
type backend interface {
	List(ctx context.Context, f queue.ListFilter) (*queue.Page, error)
	Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error)
	Requeue(ctx context.Context, tenant, id string) error
	Resolve(ctx context.Context, tenant, id string, as envelope.State) error
	Consent(ctx context.Context, tenant, user string) (queue.Consent, error)
	SetConsent(ctx context.Context, tenant, user string, f queue.ConsentFlags) error
	LiftSuppression(ctx context.Context, tenant, user string, ch envelope.Channel, target string) error
	Erase(ctx context.Context, tenant, user string) error
	Counts(ctx context.Context, tenant string) (queue.Counts, error)
	Quarantined(ctx context.Context) ([]filestore.QuarantineRecord, error)
	Check(ctx context.Context) (*filestore.Report, error)
	Prune(ctx context.Context) (int, error)
	// The tenant's address suppressions (suppressions.go).
	SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error
	AddressSuppressions(ctx context.Context, tenant string) ([]queue.Suppression, error)
	LiftAddressSuppression(ctx context.Context, tenant, target string) error
	Close() error
}

// directBackend serves the commands from a store opened in this process:
// the file store, or the PostgreSQL store (which every process shares, so
// no socket is needed there).
type directBackend struct{ q queue.Store }

// errNotFiles is the answer of a file store check on PostgreSQL.
var errNotFiles = errors.New("this works on the file store only (--data); the store is in PostgreSQL, where it does not apply")

func (d *directBackend) List(ctx context.Context, f queue.ListFilter) (*queue.Page, error) {
	return d.q.List(ctx, f)
}
func (d *directBackend) Get(ctx context.Context, t, id string) (*queue.EnvelopeStatus, error) {
	return d.q.Get(ctx, t, id)
}
func (d *directBackend) Requeue(ctx context.Context, t, id string) error {
	return d.q.Requeue(ctx, t, id)
}
func (d *directBackend) Resolve(ctx context.Context, t, id string, as envelope.State) error {
	return d.q.Resolve(ctx, t, id, as)
}
func (d *directBackend) Consent(ctx context.Context, t, u string) (queue.Consent, error) {
	return d.q.Consent(ctx, t, u)
}
func (d *directBackend) SetConsent(ctx context.Context, t, u string, f queue.ConsentFlags) error {
	return d.q.SetConsent(ctx, t, u, f)
}
func (d *directBackend) LiftSuppression(ctx context.Context, t, u string, ch envelope.Channel, target string) error {
	return d.q.LiftSuppression(ctx, t, u, ch, target)
}
func (d *directBackend) Erase(ctx context.Context, t, u string) error { return d.q.Erase(ctx, t, u) }
func (d *directBackend) Counts(ctx context.Context, t string) (queue.Counts, error) {
	return d.q.Counts(ctx, t)
}
func (d *directBackend) Quarantined(context.Context) ([]filestore.QuarantineRecord, error) {
	fq, ok := d.q.(*filestore.Queue)
	if !ok {
		return nil, errNotFiles
	}
	return fq.Quarantined()
}
func (d *directBackend) Check(context.Context) (*filestore.Report, error) {
	fq, ok := d.q.(*filestore.Queue)
	if !ok {
		return nil, errNotFiles
	}
	return fq.Check()
}
func (d *directBackend) Prune(ctx context.Context) (int, error) { return d.q.Prune(ctx) }
func (d *directBackend) Close() error                           { return nil }

// opRequest is one call over the operator socket.
type opRequest struct {
	Tenant string             `json:"tenant,omitempty"`
	ID     string             `json:"id,omitempty"`
	User   string             `json:"user,omitempty"`
	As     envelope.State     `json:"as,omitempty"`
	Filter queue.ListFilter   `json:"filter,omitzero"`
	Flags  queue.ConsentFlags `json:"flags,omitzero"`
	// Address is an e-mail address (suppress-email) or an address target
	// (lift-address); Reason a suppression's class.
	Address string              `json:"address,omitempty"`
	Reason  envelope.ErrorClass `json:"reason,omitempty"`
	Channel envelope.Channel    `json:"channel,omitempty"` // lift-suppression (Address: the target)
}

type opError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// operatorHandler serves POST /op/<method> on the socket.
func operatorHandler(b backend) http.Handler {
	mux := http.NewServeMux()
	handle := func(name string, fn func(ctx context.Context, r opRequest) (any, error)) {
		mux.HandleFunc("POST /op/"+name, func(w http.ResponseWriter, req *http.Request) {
			var r opRequest
			if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&r); err != nil {
				writeOp(w, nil, fmt.Errorf("bad request"))
				return
			}
			v, err := fn(req.Context(), r)
			writeOp(w, v, err)
		})
	}
	handle("list", func(ctx context.Context, r opRequest) (any, error) { return b.List(ctx, r.Filter) })
	handle("get", func(ctx context.Context, r opRequest) (any, error) { return b.Get(ctx, r.Tenant, r.ID) })
	handle("requeue", func(ctx context.Context, r opRequest) (any, error) { return nil, b.Requeue(ctx, r.Tenant, r.ID) })
	handle("resolve", func(ctx context.Context, r opRequest) (any, error) {
		return nil, b.Resolve(ctx, r.Tenant, r.ID, r.As)
	})
	handle("consent", func(ctx context.Context, r opRequest) (any, error) { return b.Consent(ctx, r.Tenant, r.User) })
	handle("lift-suppression", func(ctx context.Context, r opRequest) (any, error) {
		return nil, b.LiftSuppression(ctx, r.Tenant, r.User, r.Channel, r.Address)
	})
	handle("set-consent", func(ctx context.Context, r opRequest) (any, error) {
		return nil, b.SetConsent(ctx, r.Tenant, r.User, r.Flags)
	})
	handle("erase", func(ctx context.Context, r opRequest) (any, error) { return nil, b.Erase(ctx, r.Tenant, r.User) })
	handle("counts", func(ctx context.Context, r opRequest) (any, error) { return b.Counts(ctx, r.Tenant) })
	handle("quarantine", func(ctx context.Context, r opRequest) (any, error) { return b.Quarantined(ctx) })
	handle("check", func(ctx context.Context, r opRequest) (any, error) { return b.Check(ctx) })
	handle("prune", func(ctx context.Context, r opRequest) (any, error) { return b.Prune(ctx) })
	handleAddressOps(handle, b)
	return mux
}

func writeOp(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		code := "failed"
		switch {
		case errors.Is(err, queue.ErrNotFound):
			code = "not_found"
		case errors.Is(err, queue.ErrInvalidTransition):
			code = "invalid_transition"
		}
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(opError{Code: code, Message: err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// remoteError is an error the daemon returned: its message as the daemon
// wrote it (already prefixed), and the sentinel it stands for.
type remoteError struct {
	sentinel error
	msg      string
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// opTimeout bounds an operator command's call to a running daemon (a
// variable for tests).
var opTimeout = 30 * time.Second

// socketBackend calls a running daemon over its operator socket.
type socketBackend struct {
	c    *http.Client
	path string // the socket, for errors
	dir  string // the data directory, for the daemon's pid
}

func (s *socketBackend) call(ctx context.Context, method string, r opRequest, out any) error {
	body, _ := json.Marshal(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://outbox/op/"+method, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := s.c.Do(req)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
			return s.noAnswer()
		}
		return fmt.Errorf("operator socket: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e opError
		_ = json.NewDecoder(resp.Body).Decode(&e)
		switch e.Code {
		case "not_found":
			return queue.ErrNotFound
		case "invalid_transition":
			return &remoteError{queue.ErrInvalidTransition, e.Message}
		}
		return errors.New(e.Message)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// noAnswer is the error of a call the daemon took but did not answer: a
// serve stopped with SIGSTOP, on a suspended machine, or stuck.
func (s *socketBackend) noAnswer() error {
	who, resume := "the serve on "+s.dir, "resume it (kill -CONT)"
	if pid := filestore.PID(s.dir); pid > 0 {
		who = fmt.Sprintf("serve (pid %d)", pid)
		resume = fmt.Sprintf("resume it (kill -CONT %d)", pid)
	}
	return fmt.Errorf("operator socket %s: %s took the call but did not answer within %s: it may be stopped (SIGSTOP, a suspended machine) or stuck; %s, or stop it and run the command again", s.path, who, opTimeout, resume)
}

func (s *socketBackend) List(ctx context.Context, f queue.ListFilter) (*queue.Page, error) {
	var p queue.Page
	return &p, s.call(ctx, "list", opRequest{Filter: f}, &p)
}
func (s *socketBackend) Get(ctx context.Context, t, id string) (*queue.EnvelopeStatus, error) {
	var st queue.EnvelopeStatus
	return &st, s.call(ctx, "get", opRequest{Tenant: t, ID: id}, &st)
}
func (s *socketBackend) Requeue(ctx context.Context, t, id string) error {
	return s.call(ctx, "requeue", opRequest{Tenant: t, ID: id}, nil)
}
func (s *socketBackend) Resolve(ctx context.Context, t, id string, as envelope.State) error {
	return s.call(ctx, "resolve", opRequest{Tenant: t, ID: id, As: as}, nil)
}
func (s *socketBackend) Consent(ctx context.Context, t, u string) (queue.Consent, error) {
	var c queue.Consent
	return c, s.call(ctx, "consent", opRequest{Tenant: t, User: u}, &c)
}
func (s *socketBackend) LiftSuppression(ctx context.Context, t, u string, ch envelope.Channel, target string) error {
	return s.call(ctx, "lift-suppression", opRequest{Tenant: t, User: u, Channel: ch, Address: target}, nil)
}
func (s *socketBackend) SetConsent(ctx context.Context, t, u string, f queue.ConsentFlags) error {
	return s.call(ctx, "set-consent", opRequest{Tenant: t, User: u, Flags: f}, nil)
}
func (s *socketBackend) Erase(ctx context.Context, t, u string) error {
	return s.call(ctx, "erase", opRequest{Tenant: t, User: u}, nil)
}
func (s *socketBackend) Counts(ctx context.Context, t string) (queue.Counts, error) {
	c := queue.Counts{}
	return c, s.call(ctx, "counts", opRequest{Tenant: t}, &c)
}
func (s *socketBackend) Quarantined(ctx context.Context) ([]filestore.QuarantineRecord, error) {
	var q []filestore.QuarantineRecord
	return q, s.call(ctx, "quarantine", opRequest{}, &q)
}
func (s *socketBackend) Check(ctx context.Context) (*filestore.Report, error) {
	var r filestore.Report
	return &r, s.call(ctx, "check", opRequest{}, &r)
}
func (s *socketBackend) Prune(ctx context.Context) (int, error) {
	var n int
	return n, s.call(ctx, "prune", opRequest{}, &n)
}
func (s *socketBackend) Close() error { return nil }

// openBackendFor opens the PostgreSQL store when db names one (never
// migrating it: that is outbox migrate's or serve's), else openBackend.
func openBackendFor(ctx context.Context, e *env, dir string, db *dbFlags) (backend, func(), error) {
	dsn, err := db.dsn(e)
	if err != nil {
		return nil, nil, err
	}
	if dsn == "" {
		return openBackend(dir)
	}
	pg, err := openPG(ctx, dsn, *db.schema, true, "", queue.Options{Logger: newLogger(e, "text")})
	if err != nil {
		return nil, nil, err
	}
	return &directBackend{q: pg}, func() { pg.Close() }, nil
}

// openBackend reaches the daemon when its socket answers, else opens the
// store in dir.
func openBackend(dir string) (backend, func(), error) {
	path, err := operatorSocket(dir)
	if err != nil {
		return nil, nil, err
	}
	if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
		conn.Close()
		c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}, Timeout: opTimeout}
		return &socketBackend{c: c, path: path, dir: dir}, func() {}, nil
	}
	if err := fileStoreDir(dir); err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, filestore.IndexFile)); err != nil {
		if !neverOpened(dir) {
			return nil, nil, fmt.Errorf("the index %s is missing (the store had one): run \"outbox doctor --rebuild --data %s\" to rebuild it from the logs", filepath.Join(dir, filestore.IndexFile), dir)
		}
		if _, err := os.Stat(filepath.Join(dir, "logs")); err != nil {
			return nil, nil, fmt.Errorf("no store in %s (run outbox serve or outbox demo first, or pass --data)", dir)
		}
		// Only appended to: opening indexes the records as new work.
	}
	if err := checkOwner(dir); err != nil {
		return nil, nil, err
	}
	q, err := filestore.Open(dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		return nil, nil, err
	}
	return &directBackend{q: q}, func() { q.Close() }, nil
}

// opCommand builds the common shape: flags, then a backend.
func opCommand(name, short, usage string, fn func(ctx context.Context, e *env, b backend, tenant string, json bool, args []string) int, extra func(s *settings)) *command {
	return &command{Name: name, Short: short, Words: leadWords(usage), Run: func(ctx context.Context, e *env, args []string) int {
		s := newSettings(name, e)
		s.usage("Usage: outbox " + name + " " + usage + "\n\nWorks through a running outbox serve (its operator socket) or on the store directly;\nwith --database-url on the PostgreSQL store directly, serve running or not.\n\nFlags:\n")
		data := dataFlag(s)
		db := addDBFlags(s)
		var tenant *string
		if name == "ls" || name == "stats" {
			tenant = s.str("tenant", "OUTBOX_TENANT", "*", "tenant (* = every tenant)")
		} else {
			tenant = tenantFlag(s)
		}
		js := s.fs.Bool("json", false, "print JSON")
		if extra != nil {
			extra(s)
		}
		if code, done := s.parse(args); done {
			return code
		}
		b, closeFn, err := openBackendFor(ctx, e, *data, db)
		if err != nil {
			return fail(e, "%v", err)
		}
		defer closeFn()
		return fn(ctx, e, b, *tenant, *js, s.fs.Args())
	}}
}

func printJSON(e *env, v any) int {
	enc := json.NewEncoder(e.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fail(e, "%v", err)
	}
	return exitOK
}

func opErr(e *env, err error) int {
	switch {
	case errors.Is(err, queue.ErrNotFound):
		return fail(e, "not found")
	case errors.Is(err, queue.ErrInvalidTransition):
		return fail(e, "%v", err)
	}
	return fail(e, "%v", err)
}

// envErr is opErr for a command on one envelope: a missing id says where
// it is when another tenant has it (a bounded look at the listing), and
// how to name a tenant otherwise.
func envErr(ctx context.Context, e *env, b backend, tenant, id string, err error) int {
	if !errors.Is(err, queue.ErrNotFound) {
		return opErr(e, err)
	}
	f := queue.ListFilter{Limit: 1000}
	for page := 0; page < 5; page++ {
		p, lerr := b.List(ctx, f)
		if lerr != nil {
			break
		}
		for _, r := range p.Rows {
			if r.Key.EnvelopeID == id && r.Key.Tenant != tenant {
				return fail(e, "%s not found in tenant %q; it is in tenant %q: add --tenant %s", id, tenant, r.Key.Tenant, r.Key.Tenant)
			}
		}
		if p.Next == "" {
			break
		}
		f.Cursor = p.Next
	}
	return fail(e, "%s not found in tenant %q (another tenant's envelopes need --tenant T; outbox ls lists every tenant's)", id, tenant)
}

// needArgs checks that args holds n arguments, none of them empty (an
// empty ID or USER is a shell variable that was not set).
func needArgs(e *env, args []string, n int, usage string) bool {
	if len(args) != n || slices.Contains(args, "") {
		fmt.Fprintf(e.Stderr, "Error: usage: outbox %s\n", usage)
		if len(args) == n {
			fmt.Fprintln(e.Stderr, "(an argument is empty: a shell variable that was not set?)")
		}
		return false
	}
	return true
}

var (
	lsState, lsChannel, lsClass, lsUser *string
	lsLimit                             *int
	lsQuarantine                        *bool
	resolveAs                           *string
	resolveBulk, requeueBulk            *bulkFlags
	consentFlags                        struct {
		digest, push, verified *bool
		cadence, target        *string
	}
)

func init() {
	register(opCommand("ls", "list deliveries by state and channel (or --quarantine)", "[--state S] [--channel C] [--class C] [--user U] [--limit N] [--quarantine] [--json]",
		func(ctx context.Context, e *env, b backend, tenant string, js bool, args []string) int {
			if *lsQuarantine {
				qr, err := b.Quarantined(ctx)
				if err != nil {
					return opErr(e, err)
				}
				if js {
					return printJSON(e, qr)
				}
				tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "LOG\tOFFSET\tAT\tREASON")
				for _, r := range qr {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", r.Log, r.Offset, r.At.Format(time.RFC3339), r.Reason)
				}
				tw.Flush()
				return exitOK
			}
			sel, code, ok := parseSelection(e, tenant, *lsState, *lsChannel, *lsClass, *lsUser)
			if !ok {
				return code
			}
			if *lsLimit < 0 {
				fmt.Fprintln(e.Stderr, "Error: --limit must be 0 (every row) or more")
				return exitUsage
			}
			rows, more, err := sel.rows(ctx, b, *lsLimit)
			if err != nil {
				return opErr(e, err)
			}
			p := &queue.Page{Rows: rows}
			if p.Rows == nil {
				p.Rows = []queue.Row{}
			}
			if js {
				return printJSON(e, p)
			}
			tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TENANT\tID\tSEG\tCHANNEL\tSTATE\tATTEMPTS\tCLASS\tUPDATED")
			for _, r := range p.Rows {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", r.Key.Tenant, r.Key.EnvelopeID, r.Key.Segment, r.Channel, r.State, r.Attempts, dash(string(r.Class)), r.UpdatedAt.Format(time.RFC3339))
			}
			tw.Flush()
			if more {
				fmt.Fprintf(e.Stderr, "(more rows: raise --limit, or --limit 0 for every one)\n")
			}
			return exitOK
		}, func(s *settings) {
			lsState = s.fs.String("state", "", "only rows in this state")
			lsChannel = s.fs.String("channel", "", "only rows of this channel")
			lsClass = s.fs.String("class", "", "only rows with this error class (index_rebuilt, database_restored, reconcile_unknown, …)")
			lsUser = s.fs.String("user", "", "only this user's rows")
			lsLimit = s.fs.Int("limit", 100, "at most this many rows (0 = every row)")
			lsQuarantine = s.fs.Bool("quarantine", false, "list quarantined log lines instead")
		}))
	register(opCommand("show", "show one envelope: state, segments, attempt history", "ID [--json]",
		func(ctx context.Context, e *env, b backend, tenant string, js bool, args []string) int {
			if !needArgs(e, args, 1, "show ID") {
				return exitUsage
			}
			st, err := b.Get(ctx, tenant, args[0])
			if err != nil {
				return envErr(ctx, e, b, tenant, args[0], err)
			}
			st.Envelope = nil // personal data stays in the store
			if js {
				return printJSON(e, st)
			}
			fmt.Fprintf(e.Stdout, "%s/%s  %s  %s  %s  enqueued %s\n", st.Tenant, st.ID, st.Channel, st.Template, strings.ToUpper(st.Status), st.EnqueuedAt.Format(time.RFC3339))
			for _, s := range st.Segments {
				fmt.Fprintf(e.Stdout, "  segment %d: %s, %d attempt(s)%s\n", s.Index, s.State, s.Attempts, suffix(" class ", string(s.Class)))
				for _, h := range s.History {
					fmt.Fprintf(e.Stdout, "    %s  attempt %d → %s%s\n", h.At.Format(time.RFC3339), h.Attempt, h.State, suffix(" ", string(h.Class)))
				}
			}
			return exitOK
		}, nil))
	register(opCommand("requeue", "return a dead-lettered, unresolved, expired or suppressed envelope to pending (refused, with the reason, while consent refuses it); --all: every one the filters pick", "ID | --all --state S [--channel C] [--class C] [--user U] [--dry-run]",
		func(ctx context.Context, e *env, b backend, tenant string, js bool, args []string) int {
			if *requeueBulk.all {
				if len(args) != 0 || *requeueBulk.state == "" {
					fmt.Fprintln(e.Stderr, "Error: usage: outbox requeue --all --state dead_letter|unresolved|expired|suppressed [--channel C] [--class C] [--user U] [--tenant T|'*'] [--dry-run] (no ID)")
					return exitUsage
				}
				sel, code, ok := parseSelection(e, tenant, *requeueBulk.state, *requeueBulk.channel, *requeueBulk.class, *requeueBulk.user)
				if !ok {
					return code
				}
				if !queue.Requeueable(sel.filter.State) {
					fmt.Fprintf(e.Stderr, "Error: --state %s: requeue applies to dead_letter, unresolved, expired and suppressed rows\n", sel.filter.State)
					return exitUsage
				}
				res, err := bulk(ctx, b, sel, *requeueBulk.dryRun, b.Requeue)
				return printBulk(e, js, sel, "requeue", "requeued", "", res, err)
			}
			if requeueBulk.used() {
				fmt.Fprintln(e.Stderr, "Error: --state, --channel, --class, --user and --dry-run go with --all")
				return exitUsage
			}
			if !needArgs(e, args, 1, "requeue ID") {
				return exitUsage
			}
			if err := b.Requeue(ctx, tenant, args[0]); err != nil {
				return envErr(ctx, e, b, tenant, args[0], err)
			}
			fmt.Fprintf(e.Stdout, "requeued %s/%s\n", tenant, args[0])
			return exitOK
		}, func(s *settings) { requeueBulk = addBulkFlags(s, true) }))
	register(opCommand("resolve", "settle an unresolved envelope as sent or retry; --all: every unresolved one the filters pick", "ID --as sent|retry | --all --as sent|retry [--channel C] [--class C] [--user U] [--dry-run]",
		func(ctx context.Context, e *env, b backend, tenant string, js bool, args []string) int {
			as := map[string]envelope.State{"sent": envelope.StateSent, "retry": envelope.StateRetryable, "retryable": envelope.StateRetryable}[*resolveAs]
			if as == "" {
				fmt.Fprintln(e.Stderr, "Error: --as must be sent or retry")
				return exitUsage
			}
			if *resolveBulk.all {
				if len(args) != 0 {
					fmt.Fprintln(e.Stderr, "Error: usage: outbox resolve --all --as sent|retry [--channel C] [--class C] [--user U] [--tenant T|'*'] [--dry-run] (no ID)")
					return exitUsage
				}
				sel, code, ok := parseSelection(e, tenant, string(envelope.StateUnresolved), *resolveBulk.channel, *resolveBulk.class, *resolveBulk.user)
				if !ok {
					return code
				}
				res, err := bulk(ctx, b, sel, *resolveBulk.dryRun, func(ctx context.Context, t, id string) error { return b.Resolve(ctx, t, id, as) })
				return printBulk(e, js, sel, "resolve", "resolved", " as "+string(as), res, err)
			}
			if resolveBulk.used() {
				fmt.Fprintln(e.Stderr, "Error: --channel, --class, --user and --dry-run go with --all")
				return exitUsage
			}
			if !needArgs(e, args, 1, "resolve ID --as sent|retry") {
				return exitUsage
			}
			if err := b.Resolve(ctx, tenant, args[0], as); err != nil {
				return envErr(ctx, e, b, tenant, args[0], err)
			}
			fmt.Fprintf(e.Stdout, "resolved %s/%s as %s\n", tenant, args[0], as)
			return exitOK
		}, func(s *settings) {
			resolveAs = s.fs.String("as", "", "sent (the message did go out) or retry (deliver it again)")
			resolveBulk = addBulkFlags(s, false)
		}))
	register(opCommand("consent", "show, set or lift a user's consent: consent show USER | consent set USER [--digest] [--push] [--email-verified] | consent lift USER CHANNEL [--target T]", "show|set|lift USER [CHANNEL] [flags]",
		func(ctx context.Context, e *env, b backend, tenant string, js bool, args []string) int {
			const usage = "Error: usage: outbox consent show|set USER [--digest] [--push] [--email-verified] [--cadence weekly|daily] | consent lift USER CHANNEL [--target T]"
			if len(args) < 2 || (args[0] != "lift" && len(args) != 2) || (args[0] == "lift" && len(args) != 3) ||
				(args[0] != "show" && args[0] != "set" && args[0] != "lift") {
				fmt.Fprintln(e.Stderr, usage)
				return exitUsage
			}
			user := args[1]
			switch args[0] {
			case "set":
				f := queue.ConsentFlags{DigestEnabled: *consentFlags.digest, PushEnabled: *consentFlags.push, EmailVerified: *consentFlags.verified, Cadence: *consentFlags.cadence, By: "cli"}
				if err := b.SetConsent(ctx, tenant, user, f); err != nil {
					return opErr(e, err)
				}
			case "lift":
				ch, err := envelope.ParseChannel(args[2])
				if err != nil {
					fmt.Fprintf(e.Stderr, "Error: channel %q: %v\n", args[2], err)
					return exitUsage
				}
				if err := b.LiftSuppression(ctx, tenant, user, ch, *consentFlags.target); errors.Is(err, queue.ErrNotFound) {
					return fail(e, "%s has no %s suppression to lift in tenant %q (outbox consent show %s lists them)", user, ch, tenant, user)
				} else if err != nil {
					return opErr(e, err)
				}
			}
			c, err := b.Consent(ctx, tenant, user)
			if err != nil {
				return opErr(e, err)
			}
			if js {
				return printJSON(e, c)
			}
			if c.UpdatedAt.IsZero() && len(c.Suppressions) == 0 {
				fmt.Fprintf(e.Stdout, "no consent record for %s in tenant %q: e-mail and push are refused until one is set with outbox consent set %s --digest --push --email-verified\n", user, tenant, user)
				return exitOK
			}
			fmt.Fprintf(e.Stdout, "digest_enabled=%v push_enabled=%v email_verified=%v cadence=%s\n", c.DigestEnabled, c.PushEnabled, c.EmailVerified, dash(c.Cadence))
			for _, s := range c.Suppressions {
				fmt.Fprintf(e.Stdout, "suppressed %s%s: %s since %s\n", s.Channel, suffix(" target ", s.Target), s.Reason, s.At.Format(time.RFC3339))
			}
			for _, h := range c.History {
				fmt.Fprintf(e.Stdout, "history %s %s%s\n", h.At.Format(time.RFC3339), h.Change, suffix(" by ", h.By))
			}
			return exitOK
		}, func(s *settings) {
			consentFlags.digest = s.fs.Bool("digest", false, "digest e-mails enabled")
			consentFlags.push = s.fs.Bool("push", false, "push nudges enabled")
			consentFlags.verified = s.fs.Bool("email-verified", false, "the e-mail address is verified")
			consentFlags.cadence = s.fs.String("cadence", "", "weekly or daily")
			consentFlags.target = s.fs.String("target", "", "lift: only the suppression of this target (as consent show lists it)")
		}))
	register(opCommand("erase", "delete everything stored for a user: log, rows, consent, subscriptions", "USER",
		func(ctx context.Context, e *env, b backend, tenant string, js bool, args []string) int {
			if !needArgs(e, args, 1, "erase USER") {
				return exitUsage
			}
			if err := b.Erase(ctx, tenant, args[0]); err != nil {
				return opErr(e, err)
			}
			fmt.Fprintf(e.Stdout, "erased %s/%s\n", tenant, args[0])
			return exitOK
		}, nil))
	register(opCommand("stats", "row counts by state and channel", "[--json]",
		func(ctx context.Context, e *env, b backend, tenant string, js bool, args []string) int {
			if tenant == "*" {
				tenant = ""
			}
			c, err := b.Counts(ctx, tenant)
			if err != nil {
				return opErr(e, err)
			}
			if js {
				return printJSON(e, c)
			}
			tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprint(tw, "STATE")
			for _, ch := range envelope.Channels {
				fmt.Fprintf(tw, "\t%s", ch)
			}
			fmt.Fprintln(tw, "\tTOTAL")
			for _, st := range envelope.States {
				fmt.Fprint(tw, st)
				for _, ch := range envelope.Channels {
					fmt.Fprintf(tw, "\t%d", c[st][ch])
				}
				fmt.Fprintf(tw, "\t%d\n", c.Total(st))
			}
			tw.Flush()
			return exitOK
		}, nil))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func suffix(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}
