package httpapi

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/outboxhq/outbox/queue/memstore"
)

// allocated returns the fewest bytes allocated by one run of f over
// three (runtime.MemStats.TotalAlloc before and after: the fewest, so that
// a background goroutine's allocations do not count).
func allocated(f func()) uint64 {
	best := ^uint64(0)
	for range 3 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		best = min(best, after.TotalAlloc-before.TotalAlloc)
	}
	return best
}

// fill repeats unit between pre and post up to about n bytes in all.
func fill(n int, pre, unit, post string) string {
	k := (n - len(pre) - len(post)) / len(unit)
	return pre + strings.TrimSuffix(strings.Repeat(unit, k), ",") + post
}

// TestPostEnvelopes_AllocationBounded posts bodies of 1 MiB made of many
// tiny JSON values. Decoding them whole allocated 44 to 68 times the body
// (a 1 MiB body: up to 71 MB, about 50 MB of it live at once); they are
// refused after one pass over their bytes, allocating about the body once
// (it is read into one buffer of its Content-Length).
func TestPostEnvelopes_AllocationBounded(t *testing.T) {
	const size = DefaultMaxBody
	h, err := New(Config{Store: memstore.New(nil), Token: testToken, MaxBody: size})
	if err != nil {
		t.Fatal(err)
	}
	head := strings.TrimSuffix(mustJSON(t, reply("r/1", "u_1", "hi")), "}")
	tests := []struct {
		name, body string
		status     int
		want       string // in the answer
	}{
		{"ValuesInOneEnvelope", fill(size-64, head+`,"x":[`, "0,", "]}"), 400, "more than 50000 JSON values"},
		{"ValuesInPayload", fill(size-64, head[:strings.Index(head, `"payload":{`)+11]+`"text":"x","y":[`, "0,", "]}}"), 400, "more than 50000 JSON values"},
		{"StringsInPayload", fill(size-64, head[:strings.Index(head, `"payload":{`)+11]+`"text":"x","y":[`, `"",`, "]}}"), 400, "more than 50000 JSON values"},
		{"Keys", fill(size-64, `{"payload":{`, `"k":0,`, "}}"), 400, "more than 50000 JSON values"},
		{"NumbersArray", fill(size-64, "[", "0,", "]"), 400, "too many envelopes"},
		{"ObjectsArray", fill(size-64, "[", "{},", "]"), 400, "too many envelopes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w *httptest.ResponseRecorder
			n := allocated(func() { w = serve(h, "POST", "/v1/envelopes", tt.body) })
			if w.Code != tt.status || !strings.Contains(w.Body.String(), tt.want) {
				t.Fatalf("status %d, body %s; want %d and %q", w.Code, w.Body, tt.status, tt.want)
			}
			t.Logf("%d-byte body: %d bytes allocated (%.1f×)", len(tt.body), n, float64(n)/float64(len(tt.body)))
			if limit := 4 * uint64(len(tt.body)); n > limit {
				t.Fatalf("%d-byte body: %d bytes allocated, want at most %d (4× the body)", len(tt.body), n, limit)
			}
		})
	}
}

// TestPostEnvelopes_ProblemsBounded: a short batch of many invalid
// envelopes is answered with at most MaxProblems problems (1000 "{}" were
// answered with 419 KB of problems, from 3 KB).
func TestPostEnvelopes_ProblemsBounded(t *testing.T) {
	f := newFixture(t)
	body := fill(3001, "[", "{},", "]")
	w := f.call("POST", "/v1/envelopes", body)
	e := wantError(t, w, 400, CodeInvalidEnvelope)
	if len(e.Error.Problems) != MaxProblems+1 {
		t.Fatalf("%d problems, want %d and a last one", len(e.Error.Problems), MaxProblems)
	}
	last := e.Error.Problems[MaxProblems]
	if !strings.HasSuffix(last.Rule, " more problems not shown") || last.Index == 0 {
		t.Fatalf("last problem %+v", last)
	}
	if w.Body.Len() > 32<<10 {
		t.Fatalf("answer of %d bytes to a body of %d", w.Body.Len(), len(body))
	}
}

// blockingBody is a request body that hands out its bytes only once
// released; it says when it is first read.
type blockingBody struct {
	r       io.Reader
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func newBlockingBody(s string) *blockingBody {
	return &blockingBody{r: strings.NewReader(s), started: make(chan struct{}), release: make(chan struct{})}
}

func (b *blockingBody) Read(p []byte) (int, error) {
	b.once.Do(func() { close(b.started) })
	<-b.release
	return b.r.Read(p)
}

func (b *blockingBody) Close() error { return nil }

func TestInflightBound(t *testing.T) {
	const limit = 64 << 10
	f := newFixture(t, func(c *Config) { c.MaxBody = limit; c.MaxInflight = limit })
	f.grant("", "u_1")
	a, err := newAPI(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.h = a.mux
	post := func(body io.Reader, length int64) *http.Request {
		r := httptest.NewRequest("POST", "/v1/envelopes", body)
		r.Header.Set("Authorization", "Bearer "+testToken)
		r.Header.Set("Content-Type", "application/json")
		r.ContentLength = length
		return r
	}
	big := mustJSON(t, reply("big/1", "u_1", strings.Repeat("a", 40<<10)))

	// A request whose body is still arriving holds its Content-Length.
	slow := newBlockingBody(big)
	done := make(chan *httptest.ResponseRecorder)
	go func() {
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, post(slow, int64(len(big))))
		done <- w
	}()
	<-slow.started

	// Another one of that size does not fit: 503 overloaded, Retry-After,
	// the API's error body, and its body is not read.
	second := mustJSON(t, reply("big/2", "u_1", strings.Repeat("b", 40<<10)))
	unread := newBlockingBody(second)
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, post(unread, int64(len(second))))
	e := wantError(t, w, http.StatusServiceUnavailable, CodeOverloaded)
	if w.Header().Get("Retry-After") != "1" || !strings.Contains(e.Error.Message, fmt.Sprint(limit)) {
		t.Fatalf("Retry-After %q, message %q", w.Header().Get("Retry-After"), e.Error.Message)
	}
	select {
	case <-unread.started:
		t.Fatal("the refused request's body was read")
	default:
	}
	// A body of unknown length counts MaxBody: refused too.
	w = httptest.NewRecorder()
	f.h.ServeHTTP(w, post(strings.NewReader(second), -1))
	wantError(t, w, http.StatusServiceUnavailable, CodeOverloaded)
	// A small body fits beside it (it counts MinInflightWeight), and a
	// request without a body is not counted.
	f.enqueue(http.StatusCreated, reply("small/1", "u_1", "short"))
	if w := f.call("GET", "/v1/stats", ""); w.Code != http.StatusOK {
		t.Fatalf("GET /v1/stats: %d %s", w.Code, w.Body)
	}

	// Once the first is answered, its bytes are free again.
	close(slow.release)
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("slow request: %d %s", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	f.h.ServeHTTP(w, post(strings.NewReader(second), int64(len(second))))
	if w.Code != http.StatusCreated {
		t.Fatalf("after the slow one: %d %s", w.Code, w.Body)
	}
	// Refused or answered, every request gave its bytes back.
	if a.inflight.used != 0 {
		t.Fatalf("%d bytes still counted in flight", a.inflight.used)
	}
}

func TestInflightBound_Weights(t *testing.T) {
	a := &api{cfg: Config{MaxBody: 1 << 20, MaxInflight: 512 << 10}}
	for _, tt := range []struct {
		length int64
		want   int64
	}{
		{0, 0},
		{100, MinInflightWeight},
		{100 << 10, 100 << 10},
		{-1, 512 << 10},      // unknown: MaxBody, capped at the limit
		{2 << 20, 512 << 10}, // refused unread as too large; counted at most the limit
	} {
		r := httptest.NewRequest("POST", "/v1/envelopes", strings.NewReader("x"))
		r.ContentLength = tt.length
		if got := a.bodyWeight(r); got != tt.want {
			t.Errorf("Content-Length %d: weight %d, want %d", tt.length, got, tt.want)
		}
	}
	if (&api{cfg: Config{MaxBody: 1 << 20, MaxInflight: -1}}).bodyWeight(httptest.NewRequest("POST", "/", strings.NewReader("x"))) == 0 {
		t.Error("no weight without a limit")
	}
	f := inflight{limit: 10}
	if !f.acquire(6) || f.acquire(5) || !f.acquire(4) {
		t.Fatal("acquire")
	}
	f.release(6)
	f.release(4)
	if f.used != 0 {
		t.Fatalf("used %d after releases", f.used)
	}
	u := inflight{limit: -1}
	if !u.acquire(1 << 40) {
		t.Fatal("no limit refused")
	}
}

// The default is applied, and a negative MaxInflight means no bound.
func TestInflightBound_Config(t *testing.T) {
	for _, tt := range []struct{ in, want int64 }{{0, DefaultMaxInflight}, {-1, -1}, {1 << 20, 1 << 20}} {
		a, err := newAPI(Config{Store: memstore.New(nil), Token: testToken, MaxInflight: tt.in})
		if err != nil {
			t.Fatal(err)
		}
		if a.inflight.limit != tt.want || a.cfg.MaxInflight != tt.want {
			t.Errorf("MaxInflight %d: limit %d, want %d", tt.in, a.inflight.limit, tt.want)
		}
	}
}
