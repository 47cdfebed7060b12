package resend

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/mail"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/internal/nofollow"
	resendapi "github.com/resend/resend-go/v2"
)

// Poller defaults.
const (
	// DefaultPollInterval is how often the poller sweeps.
	DefaultPollInterval = 5 * time.Minute
	// DefaultPageSize is the page size of GET /emails (Resend's maximum).
	DefaultPageSize = 100
	// DefaultLookback is how far back a sweep looks: e-mails created
	// earlier are not revisited.
	DefaultLookback = 48 * time.Hour
	// DefaultMaxPages bounds the pages of one sweep.
	DefaultMaxPages = 200
)

// Resend's last_event values the poller acts on.
const (
	lastEventBounced    = "bounced"
	lastEventComplained = "complained"
)

// CursorStore keeps the poller's position between runs.
type CursorStore interface {
	// LoadCursor returns the stored cursor, "" when none is stored.
	LoadCursor(ctx context.Context) (string, error)
	// SaveCursor stores cursor ("" clears it).
	SaveCursor(ctx context.Context, cursor string) error
}

// FileCursor is a CursorStore keeping the cursor in the file it names. A
// save writes a temporary file in the same directory, syncs it, renames it
// over the file and syncs the directory, so the file always holds a whole
// cursor. A missing file reads as no cursor.
type FileCursor string

// LoadCursor implements CursorStore.
func (f FileCursor) LoadCursor(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	// Never through a symbolic link: the file is inside the data
	// directory, named as it is there.
	b, err := nofollow.ReadFile(string(f), filepath.Base(string(f)), 64<<10)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("resend: load cursor: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// SaveCursor implements CursorStore.
func (f FileCursor) SaveCursor(ctx context.Context, cursor string) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	if strings.ContainsAny(cursor, "\r\n") {
		return errors.New("resend: save cursor: cursor contains a line break")
	}
	path := string(f)
	dir := filepath.Dir(path)
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		// A rename would replace the link, never write through it; but
		// it was planted: refuse, by name, as LoadCursor does.
		return fmt.Errorf("resend: save cursor: %w", &nofollow.LinkError{Name: filepath.Base(path)})
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("resend: save cursor: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.WriteString(cursor + "\n"); err != nil {
		return fmt.Errorf("resend: save cursor: %w", err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("resend: save cursor: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("resend: save cursor: %w", err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("resend: save cursor: %w", err)
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync() // best effort: not every platform syncs directories
		_ = d.Close()
	}
	return nil
}

// memCursor is the in-memory CursorStore used when none is configured.
type memCursor struct {
	mu     sync.Mutex
	cursor string
}

func (m *memCursor) LoadCursor(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cursor, nil
}

func (m *memCursor) SaveCursor(_ context.Context, c string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cursor = c
	return nil
}

// PollerOptions configure a Poller. All fields are optional.
type PollerOptions struct {
	// Tenant is the tenant suppressions are written for; default
	// envelope.DefaultTenant. Resend's list of e-mails carries no tags, so
	// the poller cannot tell which tenant sent a bounced e-mail: every
	// suppression it finds goes to this tenant. Where several tenants send
	// through one Resend account, use the webhook (WebhookHandler reads the
	// TagTenant tag), or one account and poller per tenant.
	Tenant string
	// Interval is the time between sweeps; default DefaultPollInterval.
	Interval time.Duration
	// Cursor keeps the position inside a sweep across restarts; default in
	// memory. Use FileCursor for a daemon.
	Cursor CursorStore
	// PageSize is the page size, 1..100; default DefaultPageSize.
	PageSize int
	// Lookback is how far back a sweep goes; default DefaultLookback.
	Lookback time.Duration
	// MaxPages bounds the pages of one sweep; default DefaultMaxPages.
	MaxPages int
	// Logger receives operational logs (counts and classes only); default
	// the provider's logger.
	Logger *slog.Logger
	// Now is the clock; default the provider's clock.
	Now func() time.Time
}

// Poller finds bounced and complained e-mails by listing them from Resend,
// for installs without a public webhook endpoint.
//
// A sweep walks GET /emails from the newest e-mail towards older ones
// (after=<id of the last e-mail of the previous page>), suppressing the
// recipient (the listed e-mail's "to") of every e-mail whose last_event is
// bounced (reason envelope.ClassBounced) or complained
// (envelope.ClassComplaint). It stops at the first e-mail created before
// the Lookback, at the end of the list, or after MaxPages pages, and clears
// the cursor; the next sweep starts again from the newest e-mail, because a
// bounce changes an e-mail that was already listed. The cursor is saved
// after each page, so a sweep interrupted by a crash resumes after the last
// page it finished.
//
// Every request waits for the provider's rate limiter.
type Poller struct {
	client   *Provider
	sup      channels.Suppressor
	tenant   string
	interval time.Duration
	cursor   CursorStore
	pageSize int
	lookback time.Duration
	maxPages int
	log      *slog.Logger
	now      func() time.Time
	seen     *seenSet // e-mail id + event already suppressed

	mu sync.Mutex // one sweep at a time
}

// NewPoller returns a Poller that lists e-mails with client (its API key,
// HTTP client and rate limiter) and writes suppressions to s.
func NewPoller(client *Provider, s channels.Suppressor, opts PollerOptions) (*Poller, error) {
	if client == nil {
		return nil, errors.New("resend: NewPoller: client is required")
	}
	if s == nil {
		return nil, errors.New("resend: NewPoller: suppressor is required")
	}
	if opts.Interval < 0 {
		return nil, errors.New("resend: PollerOptions.Interval must not be negative")
	}
	if opts.PageSize < 0 || opts.PageSize > 100 {
		return nil, errors.New("resend: PollerOptions.PageSize must be between 1 and 100")
	}
	if opts.Lookback < 0 {
		return nil, errors.New("resend: PollerOptions.Lookback must not be negative")
	}
	if opts.MaxPages < 0 {
		return nil, errors.New("resend: PollerOptions.MaxPages must not be negative")
	}
	p := &Poller{
		client:   client,
		sup:      s,
		tenant:   opts.Tenant,
		interval: opts.Interval,
		cursor:   opts.Cursor,
		pageSize: opts.PageSize,
		lookback: opts.Lookback,
		maxPages: opts.MaxPages,
		log:      opts.Logger,
		now:      opts.Now,
	}
	if p.tenant == "" {
		p.tenant = envelope.DefaultTenant
	}
	if p.interval == 0 {
		p.interval = DefaultPollInterval
	}
	if p.cursor == nil {
		p.cursor = &memCursor{}
	}
	if p.pageSize == 0 {
		p.pageSize = DefaultPageSize
	}
	if p.lookback == 0 {
		p.lookback = DefaultLookback
	}
	if p.maxPages == 0 {
		p.maxPages = DefaultMaxPages
	}
	if p.log == nil {
		p.log = client.log
	} else {
		p.log = p.log.With(slog.String("provider", "resend"))
	}
	if p.now == nil {
		p.now = client.now
	}
	p.seen = newSeenSet(20000, p.lookback+time.Hour)
	return p, nil
}

// Run sweeps at once and then every Interval until ctx is cancelled, when
// it returns nil. A failed sweep is logged (class only) and retried at the
// next interval.
func (p *Poller) Run(ctx context.Context) error {
	for {
		if err := p.PollOnce(ctx); err != nil && ctx.Err() == nil {
			p.log.LogAttrs(ctx, slog.LevelWarn, "resend poller: sweep failed; retrying at the next interval",
				slog.String("error_class", string(envelope.Classify(err).Class)),
				slog.Duration("interval", p.interval))
		}
		t := time.NewTimer(p.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// PollOnce runs one sweep (resuming from the stored cursor, if any). It
// returns the first error; the cursor then still points after the last
// page fully handled.
func (p *Poller) PollOnce(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cursor, err := p.cursor.LoadCursor(ctx)
	if err != nil {
		return err
	}
	horizon := p.now().Add(-p.lookback)
	suppressed, resetOnce := 0, false
	for pages := 0; ; pages++ {
		page, err := p.client.list(ctx, cursor, p.pageSize)
		if err != nil {
			if cursor != "" && !resetOnce && staleCursor(err) {
				// The stored cursor is no longer listable (e.g. the
				// e-mail is gone): start the sweep again from the top.
				p.log.LogAttrs(ctx, slog.LevelWarn, "resend poller: stored cursor rejected; restarting the sweep")
				resetOnce, cursor = true, ""
				if err := p.cursor.SaveCursor(ctx, ""); err != nil {
					return err
				}
				continue
			}
			return fmt.Errorf("resend poller: list e-mails: %w", err)
		}
		done := !page.HasMore || len(page.Data) == 0 || pages+1 >= p.maxPages
		for i := range page.Data {
			e := &page.Data[i]
			n, err := p.handle(ctx, e)
			suppressed += n
			if err != nil {
				return err
			}
			if t, ok := parseCreatedAt(e.CreatedAt); ok && t.Before(horizon) {
				done = true
			}
		}
		if done {
			if err := p.cursor.SaveCursor(ctx, ""); err != nil {
				return err
			}
			p.log.LogAttrs(ctx, slog.LevelDebug, "resend poller: sweep done",
				slog.Int("pages", pages+1), slog.Int("suppressed", suppressed))
			return nil
		}
		last := page.Data[len(page.Data)-1].Id
		if !validID(last) {
			return errors.New("resend poller: list e-mails: an e-mail id is not a valid cursor")
		}
		cursor = last
		if err := p.cursor.SaveCursor(ctx, cursor); err != nil {
			return err
		}
	}
}

// handle suppresses e's recipients when it bounced or was complained
// about. It returns how many addresses it suppressed.
func (p *Poller) handle(ctx context.Context, e *resendapi.Email) (int, error) {
	var reason envelope.ErrorClass
	switch e.LastEvent {
	case lastEventBounced:
		reason = envelope.ClassBounced
	case lastEventComplained:
		reason = envelope.ClassComplaint
	default:
		return 0, nil
	}
	dk := e.Id + "\x00" + e.LastEvent
	now := p.now()
	if p.seen.has(dk, now) {
		return 0, nil
	}
	n := 0
	for _, to := range e.To {
		addr, err := mail.ParseAddress(to)
		if err != nil {
			p.log.LogAttrs(ctx, slog.LevelWarn, "resend poller: listed recipient is not an address; skipped",
				slog.String("reason", string(reason)))
			continue
		}
		if err := p.sup.SuppressEmail(ctx, p.tenant, addr.Address, reason); err != nil {
			return n, &callError{msg: "resend poller: recording a suppression failed", cause: err}
		}
		n++
		p.log.LogAttrs(ctx, slog.LevelInfo, "resend poller: recipient suppressed", slog.String("reason", string(reason)))
	}
	p.seen.add(dk, now)
	return n, nil
}

// staleCursor reports whether a list error means the cursor itself was
// refused (400/404/422), rather than the call failing.
func staleCursor(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.StatusCode {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// createdAtLayouts are the time formats Resend has used for created_at.
var createdAtLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999Z07",
	"2006-01-02T15:04:05.999999999Z07",
}

// parseCreatedAt parses a listed e-mail's created_at.
func parseCreatedAt(s string) (time.Time, bool) {
	s = strings.TrimSpace(s)
	for _, l := range createdAtLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// list fetches one page of GET /emails.
func (p *Provider) list(ctx context.Context, after string, limit int) (resendapi.ListEmailsResponse, error) {
	if err := p.wait(ctx); err != nil {
		return resendapi.ListEmailsResponse{}, p.failure(ctx, "poll", nil, err)
	}
	x := &exchange{}
	opts := &resendapi.ListOptions{Limit: &limit}
	if after != "" {
		opts.After = &after
	}
	resp, err := p.client.Emails.ListWithOptions(withExchange(ctx, x), opts)
	if err != nil {
		return resendapi.ListEmailsResponse{}, p.failure(ctx, "poll", x, err)
	}
	return resp, nil
}
