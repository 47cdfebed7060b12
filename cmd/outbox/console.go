package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

//go:embed console
var consoleFiles embed.FS

var consoleTmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"envLink": func(tenant, id string) string {
		return "/envelope?" + url.Values{"tenant": {tenant}, "id": {id}}.Encode()
	},
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
}).ParseFS(consoleFiles, "console/layout.html"))

const consoleHelp = `Usage: outbox console [--addr 127.0.0.1:8090] [--data DIR | --database-url URL]

Serves the operator console, a web page of the queue: counts by state and
channel, the deliveries by state, channel, class and tenant, each
envelope's segments and attempt history, and the operator's acts on them
(requeue, resolve as sent or retry, on one envelope or on every one a
filter picks). It reaches the store as the other operator commands do:
through a running outbox serve's socket, else on the files in --data
(opened for each request, so serve can start meanwhile), or on the
PostgreSQL store with --database-url. Bodies, addresses and user ids are
never shown.

It listens on loopback only (reach it from another machine through an SSH
tunnel: ssh -L 8090:127.0.0.1:8090 HOST) and prints the URL to open, which
holds a key made at start: a page opened without it is refused. The key
ends with the command (^C).

Flags:
`

func init() {
	register(&command{Name: "console", Short: "serve the operator console (a web page of the queue and its operator acts) on loopback", Run: runConsole})
}

// console is the operator console's server.
type console struct {
	key, csrf string
	cookie    string
	hosts     map[string]bool // the Host headers it answers (DNS rebinding)
	store     string          // where the store is, for the header
	files     bool
	open      func() (backend, func(), error)
}

func runConsole(ctx context.Context, e *env, args []string) int {
	s := newSettings("console", e)
	s.usage(consoleHelp)
	data := dataFlag(s)
	db := addDBFlags(s)
	addr := s.str("addr", "OUTBOX_CONSOLE_ADDR", "127.0.0.1:8090", "loopback address to listen on (port 0: any free port)")
	if code, done := s.parse(args); done {
		return code
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		fmt.Fprintf(e.Stderr, "Error: --addr %q: %v\n", *addr, err)
		return exitUsage
	}
	if !isLoopback(host) {
		return fail(e, "--addr %s: the console listens on loopback only (127.0.0.1, ::1); from another machine, tunnel to it: ssh -L 8090:127.0.0.1:8090 HOST", *addr)
	}
	c := &console{}
	dsn, err := db.dsn(e)
	if err != nil {
		return fail(e, "%v", err)
	}
	if dsn != "" {
		b, closeFn, err := openBackendFor(ctx, e, *data, db)
		if err != nil {
			return fail(e, "%v", err)
		}
		defer closeFn()
		c.store = "PostgreSQL, schema " + *db.schema
		c.open = func() (backend, func(), error) { return b, func() {}, nil }
	} else {
		dir := *data
		c.store, c.files = "files in "+dir, true
		c.open = func() (backend, func(), error) { return openBackend(dir) }
		_, closeFn, err := c.open() // fail now on a store that is not there
		if err != nil {
			return fail(e, "%v", err)
		}
		closeFn()
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fail(e, "%v (another console or program on it? choose a port with --addr 127.0.0.1:PORT, 0 for any)", err)
	}
	if err := c.keyed(ln.Addr()); err != nil {
		return fail(e, "%v", err)
	}
	srv := &http.Server{Handler: c.handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: time.Minute}
	fmt.Fprintf(e.Stdout, "console for the %s on http://%s/\nopen http://%s/login?key=%s (^C stops it)\n", c.store, ln.Addr(), ln.Addr(), c.key)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return exitOK
	case err := <-done:
		return fail(e, "%v", err)
	}
}

// keyed makes the console's key and its form token, and the cookie and
// Host names of its address.
func (c *console) keyed(addr net.Addr) error {
	key := make([]byte, 24)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	c.key = hex.EncodeToString(key)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("csrf"))
	c.csrf = hex.EncodeToString(mac.Sum(nil))
	_, port, _ := net.SplitHostPort(addr.String())
	c.cookie = "outbox_console_" + port // cookies are per host, not per port
	c.hosts = map[string]bool{addr.String(): true, "localhost:" + port: true, "127.0.0.1:" + port: true, "[::1]:" + port: true}
	return nil
}

func (c *console) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /style.css", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		b, _ := consoleFiles.ReadFile("console/style.css")
		w.Write(b)
	})
	mux.HandleFunc("GET /login", c.login)
	mux.Handle("GET /{$}", c.authed(c.overview))
	mux.Handle("GET /rows", c.authed(c.rows))
	mux.Handle("GET /envelope", c.authed(c.envelope))
	mux.Handle("GET /quarantine", c.authed(c.quarantine))
	mux.Handle("GET /doctor", c.authed(c.doctor))
	mux.Handle("POST /act", c.authed(c.act))
	mux.Handle("POST /bulk", c.authed(c.bulk))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if !c.hosts[r.Host] {
			http.Error(w, "this console answers on its own address only", http.StatusMisdirectedRequest)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// page is what every template gets; the handlers fill the fields their
// template reads.
type page struct {
	Title, Store, Flash string
	FlashError          bool
	Files               bool
	CSRF                string

	Tenant   string
	Channels []envelope.Channel
	States   []envelope.State
	Lines    []countLine

	Sel  selForm
	Rows []queue.Row
	Next string
	Bulk []act

	St   *queue.EnvelopeStatus
	Acts []act

	Op, Verb, Label, Describe, Warn, Summary, Back string
	Matched                                        int
	Failed                                         []bulkFailure

	Quarantine []filestore.QuarantineRecord
	Message    string

	Report         *filestore.Report
	Free, Advice   string
	DoctorDuration string
}

type countLine struct {
	State envelope.State
	Link  string
	Cells []countCell
	Total int
}

type countCell struct {
	N    int
	Link string
}

// selForm is a selection as the forms carry it.
type selForm struct{ State, Channel, Class, Tenant string }

func (f selForm) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"state": f.State, "channel": f.Channel, "class": f.Class, "tenant": f.Tenant} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

func (f selForm) selection() (selection, error) {
	return newSelection(f.Tenant, f.State, f.Channel, f.Class, "")
}

func formSel(r *http.Request) selForm {
	return selForm{State: r.FormValue("state"), Channel: r.FormValue("channel"), Class: r.FormValue("class"), Tenant: r.FormValue("tenant")}
}

// act is an operator act a page offers.
type act struct{ Op, Label, Class string }

var acts = map[string]act{
	"resolve-sent":  {"resolve-sent", "Resolve as sent", "quiet"},
	"resolve-retry": {"resolve-retry", "Resolve as retry", "quiet"},
	"requeue":       {"requeue", "Requeue", ""},
}

// do runs op on one envelope.
func (op act) do(ctx context.Context, b backend, tenant, id string) error {
	switch op.Op {
	case "resolve-sent":
		return b.Resolve(ctx, tenant, id, envelope.StateSent)
	case "resolve-retry":
		return b.Resolve(ctx, tenant, id, envelope.StateRetryable)
	}
	return b.Requeue(ctx, tenant, id)
}

type handlerFunc func(w http.ResponseWriter, r *http.Request, b backend, p *page) (status int, tmpl string)

// authed checks the key's cookie (and, on a POST, the form's token), opens
// the store for the request and renders the handler's template.
func (c *console) authed(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := &page{Store: c.store, Files: c.files, CSRF: c.csrf}
		ck, err := r.Cookie(c.cookie)
		if err != nil || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(c.key)) != 1 {
			p.Title, p.Message = "Open the console's URL", "This page needs the key of the running outbox console: open the URL it printed at start (…/login?key=…)."
			c.render(w, http.StatusUnauthorized, "message", p)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(c.csrf)) != 1 {
				p.Title, p.Message = "Refused", "The form did not come from this console's page: reload the page and try again."
				c.render(w, http.StatusForbidden, "message", p)
				return
			}
		}
		b, closeFn, err := c.open()
		if err != nil {
			p.Title, p.Message, p.FlashError = "The store cannot be opened", err.Error(), true
			c.render(w, http.StatusServiceUnavailable, "message", p)
			return
		}
		defer closeFn()
		status, tmpl := h(w, r, b, p)
		if tmpl != "" {
			c.render(w, status, tmpl, p)
		}
	})
}

func (c *console) render(w http.ResponseWriter, status int, tmpl string, p *page) {
	var buf bytes.Buffer // a template that fails answers 500, not half a page
	if err := consoleTmpl.ExecuteTemplate(&buf, tmpl, p); err != nil {
		http.Error(w, "the console could not draw this page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

func (c *console) login(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(r.URL.Query().Get("key")), []byte(c.key)) != 1 {
		c.render(w, http.StatusForbidden, "message", &page{Store: c.store, Title: "Wrong key",
			Message: "This key is not the running console's: open the URL that outbox console printed at this start (a new start makes a new key)."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: c.cookie, Value: c.key, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	// next is a page of this console: a path, never another host.
	next := r.URL.Query().Get("next")
	if u, err := url.Parse(next); err != nil || next == "" || next[0] != '/' || strings.HasPrefix(next, "//") || u.Host != "" || strings.ContainsRune(next, '\\') {
		next = "/"
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// storeError renders err as the page's error.
func storeError(p *page, err error) (int, string) {
	p.Title, p.Message, p.FlashError = "Error", err.Error(), true
	if errors.Is(err, queue.ErrNotFound) {
		p.Message = "Not found."
		return http.StatusNotFound, "message"
	}
	return http.StatusConflict, "message"
}

func (c *console) overview(w http.ResponseWriter, r *http.Request, b backend, p *page) (int, string) {
	p.Title, p.Tenant, p.Channels = "Overview", r.FormValue("tenant"), envelope.Channels
	counts, err := b.Counts(r.Context(), p.Tenant)
	if err != nil {
		return storeError(p, err)
	}
	for _, st := range envelope.States {
		sf := selForm{State: string(st), Tenant: p.Tenant}
		l := countLine{State: st, Link: "/rows?" + sf.values().Encode(), Total: counts.Total(st)}
		for _, ch := range envelope.Channels {
			sf.Channel = string(ch)
			l.Cells = append(l.Cells, countCell{N: counts[st][ch], Link: "/rows?" + sf.values().Encode()})
		}
		p.Lines = append(p.Lines, l)
	}
	return http.StatusOK, "overview"
}

// consolePage is how many rows a list page shows at least (all of the
// store's last page read).
const consolePage = 100

func (c *console) rows(w http.ResponseWriter, r *http.Request, b backend, p *page) (int, string) {
	p.Title, p.Channels, p.States, p.Sel = "Deliveries", envelope.Channels, envelope.States, formSel(r)
	sel, err := p.Sel.selection()
	if err != nil {
		p.Flash, p.FlashError = err.Error(), true
		return http.StatusBadRequest, "rows"
	}
	f := sel.filter
	f.Limit, f.Cursor = consolePage, r.FormValue("cursor")
	for len(p.Rows) < consolePage {
		pg, err := b.List(r.Context(), f)
		if err != nil {
			return storeError(p, err)
		}
		for _, row := range pg.Rows {
			if sel.class == "" || row.Class == sel.class {
				p.Rows = append(p.Rows, row)
			}
		}
		if f.Cursor = pg.Next; f.Cursor == "" {
			break
		}
	}
	if f.Cursor != "" {
		v := p.Sel.values()
		v.Set("cursor", f.Cursor)
		p.Next = "/rows?" + v.Encode()
	}
	if len(p.Rows) > 0 {
		switch {
		case sel.filter.State == envelope.StateUnresolved:
			p.Bulk = []act{{"resolve-sent", "Resolve every one as sent", ""}, {"resolve-retry", "Resolve every one as retry", ""}, {"requeue", "Requeue every one", ""}}
		case queue.Requeueable(sel.filter.State):
			p.Bulk = []act{{"requeue", "Requeue every one", ""}}
		}
	}
	return http.StatusOK, "rows"
}

func (c *console) envelope(w http.ResponseWriter, r *http.Request, b backend, p *page) (int, string) {
	tenant, id := r.FormValue("tenant"), r.FormValue("id")
	st, err := b.Get(r.Context(), tenant, id)
	if errors.Is(err, queue.ErrNotFound) {
		p.Title, p.FlashError = "Not found", true
		p.Message = fmt.Sprintf("Tenant %q has no envelope %q (erased, pruned after the retention, or in another tenant: the Deliveries page lists every tenant's).", tenant, id)
		return http.StatusNotFound, "message"
	}
	if err != nil {
		return storeError(p, err)
	}
	st.Envelope = nil // personal data stays in the store
	st.UserID = ""
	p.Title, p.St = id, st
	if msg, ok := doneMessages[r.FormValue("done")]; ok {
		p.Flash = msg
	}
	p.Acts = envelopeActs(st)
	return http.StatusOK, "envelope"
}

var doneMessages = map[string]string{
	"resolve-sent":  "Resolved as sent.",
	"resolve-retry": "Resolved as retry: it is delivered again.",
	"requeue":       "Requeued: it is pending again, with a fresh retry budget.",
}

// envelopeActs are the acts that apply to st's rows.
func envelopeActs(st *queue.EnvelopeStatus) []act {
	var unresolved, requeueable bool
	for _, s := range st.Segments {
		unresolved = unresolved || s.State == envelope.StateUnresolved
		requeueable = requeueable || queue.Requeueable(s.State)
	}
	var out []act
	if unresolved {
		out = append(out, acts["resolve-sent"], acts["resolve-retry"])
	}
	if requeueable {
		out = append(out, acts["requeue"])
	}
	return out
}

func (c *console) act(w http.ResponseWriter, r *http.Request, b backend, p *page) (int, string) {
	op, ok := acts[r.PostFormValue("op")]
	if !ok {
		p.Title, p.Message, p.FlashError = "Refused", "Unknown act.", true
		return http.StatusBadRequest, "message"
	}
	tenant, id := r.PostFormValue("tenant"), r.PostFormValue("id")
	if err := op.do(r.Context(), b, tenant, id); err != nil {
		status, tmpl := c.envelope(w, r, b, p)
		if tmpl == "envelope" {
			p.Flash, p.FlashError, status = op.Label+" refused: "+err.Error(), true, http.StatusConflict
		}
		return status, tmpl
	}
	v := url.Values{"tenant": {tenant}, "id": {id}, "done": {op.Op}}
	http.Redirect(w, r, "/envelope?"+v.Encode(), http.StatusSeeOther)
	return 0, ""
}

func (c *console) bulk(w http.ResponseWriter, r *http.Request, b backend, p *page) (int, string) {
	op, ok := acts[r.PostFormValue("op")]
	if !ok {
		p.Title, p.Message, p.FlashError = "Refused", "Unknown act.", true
		return http.StatusBadRequest, "message"
	}
	p.Sel = formSel(r)
	if op.Op != "requeue" {
		p.Sel.State = string(envelope.StateUnresolved)
	}
	sel, err := p.Sel.selection()
	if err == nil && !queue.Requeueable(sel.filter.State) {
		err = fmt.Errorf("requeue applies to dead_letter, unresolved, expired and suppressed rows, not %q", sel.filter.State)
	}
	if err != nil {
		p.Title, p.Message, p.FlashError = "Refused", err.Error(), true
		return http.StatusBadRequest, "message"
	}
	p.Op, p.Describe, p.Back = op.Op, sel.describe(), "/rows?"+p.Sel.values().Encode()
	p.Verb, p.Label = "resolve", "Resolve every one as sent"
	switch op.Op {
	case "resolve-sent":
		p.Warn = "Choose it only for messages the recipients did get: none of them is delivered again."
	case "resolve-retry":
		p.Label, p.Warn = "Resolve every one as retry", "Each is delivered again: a recipient who did get one gets it twice."
	case "requeue":
		p.Verb, p.Label, p.Warn = "requeue", "Requeue every one", "Each returns to pending with a fresh retry budget and is delivered again."
	}
	dry := r.PostFormValue("confirm") != "1"
	res, err := bulk(r.Context(), b, sel, dry, func(ctx context.Context, t, id string) error { return op.do(ctx, b, t, id) })
	if res == nil {
		return storeError(p, err)
	}
	p.Matched = res.Matched
	if dry {
		p.Title = p.Label + "?"
		return http.StatusOK, "confirm"
	}
	p.Title, p.Failed = p.Label, res.Failed
	p.Summary = strconv.Itoa(res.Done) + " of " + strconv.Itoa(res.Matched) + " envelopes done (" + p.Describe + ")."
	if err != nil {
		p.Summary += " " + err.Error() + "."
	}
	return http.StatusOK, "result"
}

func (c *console) quarantine(w http.ResponseWriter, r *http.Request, b backend, p *page) (int, string) {
	p.Title = "Quarantine"
	q, err := b.Quarantined(r.Context())
	if err != nil {
		return storeError(p, err)
	}
	p.Quarantine = q
	return http.StatusOK, "quarantine"
}

// doctor runs outbox doctor's check (read-only; on files) and shows it.
func (c *console) doctor(w http.ResponseWriter, r *http.Request, b backend, p *page) (int, string) {
	p.Title = "Doctor"
	start := time.Now()
	rep, err := b.Check(r.Context())
	if err != nil {
		return storeError(p, err)
	}
	p.Report, p.DoctorDuration = rep, time.Since(start).Round(time.Millisecond).String()
	p.Free = humanBytes(rep.FreeBytes) + " free"
	if rep.FreeInodes != nil {
		p.Free += ", " + strconv.FormatUint(*rep.FreeInodes, 10) + " inodes free"
	}
	if !rep.OK() {
		p.Advice = doctorAdvice(rep.Problems)
	}
	return http.StatusOK, "doctor"
}
