package main

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// consoleOn serves the console over q and returns it, its base URL and a
// client that has opened its key's URL.
func consoleOn(t *testing.T, b backend) (*console, string, *http.Client) {
	t.Helper()
	c := &console{store: "files in test", files: true, open: func() (backend, func(), error) { return b, func() {}, nil }}
	srv := httptest.NewUnstartedServer(nil)
	if err := c.keyed(srv.Listener.Addr()); err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = c.handler()
	srv.Start()
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	if code, body := get(t, cl, srv.URL+"/login?key="+c.key); code != http.StatusOK || !strings.Contains(body, "Overview") {
		t.Fatalf("login = %d\n%s", code, body)
	}
	return c, srv.URL, cl
}

func get(t *testing.T, cl *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := cl.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, cl *http.Client, u string, form url.Values) (int, string) {
	t.Helper()
	resp, err := cl.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The key guards every page, the form token every act, the Host header
// the address (a DNS-rebinding page cannot read it); login's next stays
// on the console.
func TestConsole_Guards(t *testing.T) {
	q := rebuiltStore(t, "g", 2)
	c, base, cl := consoleOn(t, &directBackend{q: q})
	anon := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/", "/rows", "/envelope?tenant=default&id=g-1", "/quarantine"} {
		if code, body := get(t, anon, base+path); code != http.StatusUnauthorized || strings.Contains(body, "g-1</") {
			t.Errorf("GET %s without the key = %d", path, code)
		}
	}
	if code, _ := get(t, anon, base+"/login?key="+strings.Repeat("0", len(c.key))); code != http.StatusForbidden {
		t.Errorf("login with a wrong key = %d", code)
	}
	resp, err := anon.Get(base + "/login?key=" + c.key + "&next=" + url.QueryEscape("//evil.example/x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); loc != "/" || resp.StatusCode != http.StatusSeeOther {
		t.Errorf("login next=//evil.example = %d to %q, want / ", resp.StatusCode, loc)
	}
	ck := resp.Cookies()
	if len(ck) != 1 || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode {
		t.Errorf("login cookie = %+v", ck)
	}
	if resp.Header.Get("Content-Security-Policy") == "" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("headers = %v", resp.Header)
	}

	req, _ := http.NewRequest("GET", base+"/", nil)
	req.Host = "rebound.example:80"
	req.AddCookie(ck[0])
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("another Host = %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// An act without the page's token is refused and changes nothing.
	for _, path := range []string{"/act", "/bulk"} {
		form := url.Values{"op": {"resolve-sent"}, "tenant": {"default"}, "id": {"g-1"}, "state": {"unresolved"}, "confirm": {"1"}}
		if code, _ := post(t, cl, base+path, form); code != http.StatusForbidden {
			t.Errorf("POST %s without the token = %d", path, code)
		}
	}
	if counts, _ := q.Counts(context.Background(), ""); counts.Total(envelope.StateUnresolved) != 3 {
		t.Fatalf("counts after refused acts: %v", counts)
	}
}

// What an operator does after a lost index, in the console: the overview
// links the unresolved count to its rows, the list pages, the bulk act
// asks first (nothing changes) then settles every one, one envelope's page
// shows its history and its acts. No page holds a recipient or a body.
func TestConsole_SettlesAfterALostIndex(t *testing.T) {
	q := rebuiltStore(t, "c", 130)
	c, base, cl := consoleOn(t, &directBackend{q: q})
	ctx := context.Background()

	_, body := get(t, cl, base+"/")
	if !strings.Contains(body, `<a href="/rows?channel=telegram&amp;state=unresolved">131</a>`) {
		t.Fatalf("overview has no link to the 131 unresolved telegram rows:\n%s", body)
	}
	pages, rows, next := 0, 0, "/rows?state=unresolved&class=index_rebuilt"
	nextRe := regexp.MustCompile(`<a href="(/rows\?[^"]*cursor=[^"]*)">Next page`)
	for next != "" && pages < 10 {
		code, body := get(t, cl, base+strings.ReplaceAll(next, "&amp;", "&"))
		if code != http.StatusOK {
			t.Fatalf("GET %s = %d", next, code)
		}
		if pages == 0 && !strings.Contains(body, "Resolve every one as sent") {
			t.Fatalf("the unresolved list offers no bulk act:\n%s", body)
		}
		rows += strings.Count(body, "index_rebuilt</td>")
		pages++
		next = ""
		if m := nextRe.FindStringSubmatch(body); m != nil {
			next = m[1]
		}
	}
	if pages != 2 || rows != 131 {
		t.Fatalf("the list showed %d rows on %d pages, want 131 on 2", rows, pages)
	}
	if _, body := get(t, cl, base+"/rows?state=unresolved&class=reconcile_unknown"); !strings.Contains(body, "No rows match") || strings.Contains(body, "every one") {
		t.Fatalf("a class no row has:\n%s", body)
	}
	if code, body := get(t, cl, base+"/rows?state=nosuch"); code != http.StatusBadRequest || !strings.Contains(body, `--state &#34;nosuch&#34;`) {
		t.Fatalf("a bad state = %d\n%s", code, body)
	}

	// One envelope: resolve it as sent, then its page says so.
	_, body = get(t, cl, base+"/envelope?tenant=default&id=c-0")
	if !strings.Contains(body, "Segment 1") || !strings.Contains(body, "Resolve as retry") || !strings.Contains(body, "index_rebuilt") {
		t.Fatalf("envelope page:\n%s", body)
	}
	code, body := post(t, cl, base+"/act", url.Values{"csrf": {c.csrf}, "op": {"resolve-sent"}, "tenant": {"default"}, "id": {"c-0"}})
	if code != http.StatusOK || !strings.Contains(body, "Resolved as sent.") || strings.Contains(body, "Resolve as retry") {
		t.Fatalf("resolve c-0 = %d\n%s", code, body)
	}
	code, body = post(t, cl, base+"/act", url.Values{"csrf": {c.csrf}, "op": {"resolve-retry"}, "tenant": {"default"}, "id": {"c-0"}})
	if code != http.StatusConflict || !strings.Contains(body, "Resolve as retry refused: ") {
		t.Fatalf("resolve c-0 again = %d\n%s", code, body)
	}
	if code, _ := get(t, cl, base+"/envelope?tenant=default&id=nosuch"); code != http.StatusNotFound {
		t.Fatalf("a missing envelope = %d", code)
	}

	// The bulk act: a confirmation with the count, then the act.
	form := url.Values{"csrf": {c.csrf}, "op": {"resolve-retry"}, "state": {"unresolved"}, "channel": {"telegram"}, "class": {"index_rebuilt"}}
	code, body = post(t, cl, base+"/bulk", form)
	if code != http.StatusOK || !strings.Contains(body, "<strong>129 envelopes</strong>") || !strings.Contains(body, "delivered again") {
		t.Fatalf("bulk without confirm = %d\n%s", code, body)
	}
	if counts, _ := q.Counts(ctx, ""); counts.Total(envelope.StateUnresolved) != 129 {
		t.Fatalf("the confirmation changed rows: %v", counts)
	}
	form.Set("confirm", "1")
	code, body = post(t, cl, base+"/bulk", form)
	if code != http.StatusOK || !strings.Contains(body, "129 of 129 envelopes done") {
		t.Fatalf("bulk = %d\n%s", code, body)
	}
	counts, _ := q.Counts(ctx, "")
	if counts.Total(envelope.StateUnresolved) != 0 || counts.Total(envelope.StateRetryable) != 129 || counts.Total(envelope.StateSent) != 2 {
		t.Fatalf("counts after the bulk act: %v", counts)
	}
	form.Set("op", "requeue")
	form.Set("state", "pending")
	if code, body := post(t, cl, base+"/bulk", form); code != http.StatusBadRequest || !strings.Contains(body, "requeue applies to") {
		t.Fatalf("requeue of pending rows = %d\n%s", code, body)
	}

	// No page shows a recipient or a body.
	for _, path := range []string{"/", "/rows", "/envelope?tenant=default&id=c-1", "/quarantine"} {
		_, body := get(t, cl, base+path)
		if strings.Contains(body, "424242") || strings.Contains(body, "lorem") || strings.Contains(body, "hello from") {
			t.Fatalf("GET %s shows personal data", path)
		}
	}
}

// outbox console listens on loopback only, prints its key's URL, and
// stops with its context.
func TestConsole_Command(t *testing.T) {
	data := t.TempDir()
	if _, errs, code := runCmd(t, "console", "--data", data, "--addr", "0.0.0.0:0"); code != exitFailure || !strings.Contains(errs, "loopback only") {
		t.Fatalf("console on 0.0.0.0 = %d %s", code, errs)
	}
	if _, errs, code := runCmd(t, "console", "--data", data+"/none", "--addr", "127.0.0.1:0"); code != exitFailure || !strings.Contains(errs, "no store in") {
		t.Fatalf("console on no store = %d %s", code, errs)
	}
	if out, errs, code := runCmd(t, "demo", "--data", data); code != 0 {
		t.Fatalf("demo = %d %s %s", code, out, errs)
	}
	login, stop := startConsole(t, func(string) string { return "" }, "--data", data)
	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	if code, body := get(t, cl, login+"&next="+url.QueryEscape("/rows?state=sent")); code != http.StatusOK || !strings.Contains(body, `<td><span class="state state-sent">sent</span></td>`) {
		t.Fatalf("the printed URL = %d\n%s", code, body)
	}
	stop()

	// On PostgreSQL: the same pages over the database's store.
	vars := map[string]string{EnvDatabaseURL: pgtest.DSN(), "OUTBOX_DATABASE_SCHEMA": pgtest.Schema(t)}
	if out, code := runIn(vars, "migrate"); code != 0 {
		t.Fatalf("migrate = %d %s", code, out)
	}
	login, stop = startConsole(t, func(k string) string { return vars[k] })
	if code, body := get(t, cl, login); code != http.StatusOK || !strings.Contains(body, "PostgreSQL, schema "+vars["OUTBOX_DATABASE_SCHEMA"]) || strings.Contains(body, pgtest.DSN()) {
		t.Fatalf("the console on PostgreSQL = %d\n%s", code, body)
	}
	stop()
}

// startConsole runs outbox console in this process on a free port and
// returns the URL it printed, and a stop that checks it ended with 0.
func startConsole(t *testing.T, getenv func(string) string, args ...string) (string, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &lockedBuffer{}
	e := &env{Stdin: strings.NewReader(""), Stdout: out, Stderr: out, Getenv: getenv}
	done := make(chan int, 1)
	go func() { done <- run(ctx, e, append([]string{"console", "--addr", "127.0.0.1:0"}, args...)) }()
	re := regexp.MustCompile(`open (http://127\.0\.0\.1:\d+/login\?key=[0-9a-f]+)`)
	var login string
	for i := 0; i < 1000 && login == ""; i++ {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			login = m[1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	if login == "" {
		cancel()
		t.Fatalf("no URL printed:\n%s", out.String())
	}
	return login, func() {
		t.Helper()
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Fatalf("console stopped with %d:\n%s", code, out.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("console did not stop with its context")
		}
	}
}

// The doctor page runs outbox doctor's check: ok on a healthy store; a
// log deleted under it is a problem, with doctor's advice.
func TestConsole_Doctor(t *testing.T) {
	q := rebuiltStore(t, "d", 3)
	_, base, cl := consoleOn(t, &directBackend{q: q})
	if code, body := get(t, cl, base+"/doctor"); code != http.StatusOK || !strings.Contains(body, `state-ok">ok<`) || !strings.Contains(body, "<dt>Envelopes</dt><dd>3</dd>") {
		t.Fatalf("doctor on a healthy store = %d\n%s", code, body)
	}
	logs, _ := filepath.Glob(filepath.Join(q.Dir(), "logs", "default-*", "*.jsonl"))
	if len(logs) == 0 {
		t.Fatal("no log")
	}
	if err := os.Remove(logs[0]); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, cl, base+"/doctor")
	if code != http.StatusOK || !strings.Contains(body, "<h2>Problems</h2>") || !strings.Contains(body, "outbox doctor") {
		t.Fatalf("doctor after a log was deleted = %d\n%s", code, body)
	}
}
