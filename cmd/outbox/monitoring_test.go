package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	rulesPath     = "../../deploy/prometheus/outbox.rules.yml"
	rulesTestPath = "../../deploy/prometheus/outbox.rules.test.yml"
	dashboardPath = "../../deploy/grafana/outbox.json"
)

// servedMetrics returns every metric family serve's /metrics can show, with
// its labels: the registry built as serve builds it (serveRegistry, then
// the app from serve's flags on a fresh data directory, and once more on
// PostgreSQL), asked to describe itself, so that families not yet observed
// count too.
func servedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	out := describeServed(t, "")
	for name, labels := range describeServed(t, pgtest.DSN()) {
		out[name] = append(out[name], labels...)
	}
	return out
}

// describeServed is servedMetrics for one store: the file store, or the
// PostgreSQL one at dsn (in a schema of its own).
func describeServed(t *testing.T, dsn string) map[string][]string {
	t.Helper()
	e := &env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}
	s := newSettings("serve", e)
	f := addServeFlags(s)
	if code, done := s.parse([]string{"--data", t.TempDir()}); done {
		t.Fatalf("serve flags: %d", code)
	}
	brand, err := f.brand.brand()
	if err != nil {
		t.Fatal(err)
	}
	reg := serveRegistry()
	cfg := f.appConfig(slog.New(slog.NewTextHandler(io.Discard, nil)), reg, "http://127.0.0.1:1", brand)
	if dsn != "" {
		cfg.DatabaseURL, cfg.DatabaseSchema = dsn, pgtest.Schema(t)
	}
	a, err := buildApp(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	ch := make(chan *prometheus.Desc)
	go func() { reg.Describe(ch); close(ch) }()
	desc := regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)
	constLabels := regexp.MustCompile(`constLabels: \{([^}]*)\}`)
	out := map[string][]string{}
	for d := range ch {
		m := desc.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the descriptor %s", d)
		}
		var labels []string
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(l), "c("), ")"); l != "" {
				labels = append(labels, l)
			}
		}
		// Constant labels (outbox_storage_free_ratio's resource) are labels too.
		if c := constLabels.FindStringSubmatch(d.String()); c != nil {
			for _, kv := range strings.Split(c[1], ",") {
				if k, _, ok := strings.Cut(strings.TrimSpace(kv), "="); ok {
					labels = append(labels, k)
				}
			}
		}
		out[m[1]] = append(out[m[1]], labels...)
	}
	for _, want := range []string{"outbox_queue_depth", "outbox_deliveries_total", "outbox_enqueued_total", "process_resident_memory_bytes"} {
		if _, ok := out[want]; !ok {
			t.Fatalf("serve's registry lacks %s: the test reads it wrong (%d families)", want, len(out))
		}
	}
	return out
}

// promSelector is one series selector of a PromQL expression.
type promSelector struct {
	name   string
	labels []string
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promMatchers = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords = []string{"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)

// promRefs returns the selectors of a PromQL expression and the labels its
// by/without/on/ignoring/group_* clauses name. It reads the expressions of
// these files, not PromQL at large: a selector without a metric name fails.
func promRefs(t *testing.T, expr string) (sels []promSelector, grouping []string) {
	t.Helper()
	s := promString.ReplaceAllString(expr, `""`)
	s = promRange.ReplaceAllString(s, " ")
	for _, m := range promGrouping.FindAllStringSubmatch(s, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				grouping = append(grouping, l)
			}
		}
	}
	s = promGrouping.ReplaceAllString(s, " ")
	for _, m := range promMatchers.FindAllStringSubmatch(s, -1) {
		if m[1] == "" {
			t.Fatalf("%q: a selector without a metric name", expr)
		}
		sel := promSelector{name: m[1]}
		for _, l := range promMatcher.FindAllStringSubmatch(m[2], -1) {
			sel.labels = append(sel.labels, l[1])
		}
		sels = append(sels, sel)
	}
	s = promMatchers.ReplaceAllString(s, " ")
	for _, loc := range promIdent.FindAllStringIndex(s, -1) {
		word := s[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsRune("0123456789.$_", rune(s[loc[0]-1])) {
			continue // inside a number or a duration (1e3, 15m), a variable
		}
		if strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") || slices.Contains(promKeywords, word) {
			continue // a function, a keyword
		}
		sels = append(sels, promSelector{name: word})
	}
	return sels, grouping
}

// checkExpr fails the test when expr names a metric serve does not
// register, or a label its metrics do not have.
func checkExpr(t *testing.T, where, expr string, served map[string][]string) {
	t.Helper()
	sels, grouping := promRefs(t, expr)
	if len(sels) == 0 {
		t.Errorf("%s: no metric in %q", where, expr)
	}
	known := []string{"job", "instance"} // the target's labels, added by Prometheus
	for _, sel := range sels {
		labels, ok := served[sel.name]
		own := []string{}
		if !ok {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, cut := strings.CutSuffix(sel.name, suffix); cut {
					labels, ok = served[base]
					if suffix == "_bucket" {
						own = []string{"le"}
					}
				}
			}
		}
		if sel.name == "up" { // made by Prometheus for each target
			ok, labels = true, nil
		}
		if !ok {
			t.Errorf("%s: %s is not a metric serve registers (%q)", where, sel.name, expr)
			continue
		}
		all := slices.Concat(known, labels, own)
		for _, l := range sel.labels {
			if !slices.Contains(all, l) {
				t.Errorf("%s: %s has no label %s (it has %v)", where, sel.name, l, labels)
			}
		}
		known = slices.Concat(known, labels, own)
	}
	for _, l := range grouping {
		if !slices.Contains(known, l) {
			t.Errorf("%s: groups by %s, a label none of its metrics has (%q)", where, l, expr)
		}
	}
}

// ruleExprs returns the expr of every rule of a rules file, single-line
// or a block scalar (expr: |).
func ruleExprs(t *testing.T, path string) map[string]string {
	t.Helper()
	lines := strings.Split(readFile(t, path), "\n")
	out := map[string]string{}
	name := ""
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimSpace(lines[i])
		if v, ok := strings.CutPrefix(trimmed, "- alert: "); ok {
			name = v
			continue
		}
		v, ok := strings.CutPrefix(trimmed, "expr: ")
		if !ok {
			continue
		}
		if _, dup := out[name]; dup || name == "" {
			t.Fatalf("%s:%d: expr of no rule, or a second one for %q", path, i+1, name)
		}
		if v == "|" {
			indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
			var block []string
			for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) > indent) {
				i++
				block = append(block, strings.TrimSpace(lines[i]))
			}
			v = strings.Join(block, " ")
		}
		out[name] = v
	}
	if n := strings.Count(readFile(t, path), "- alert: "); n != len(out) || n == 0 {
		t.Fatalf("%s: %d alerts, %d expressions read", path, n, len(out))
	}
	return out
}

// grafanaDashboard is what the tests read of the dashboard.
type grafanaDashboard struct {
	Templating struct {
		List []struct {
			Name, Type string
			Query      any
			Datasource *grafanaDatasource
		}
	}
	Panels []grafanaPanel
}

type grafanaDatasource struct{ Type, UID string }

type grafanaPanel struct {
	ID         int
	Type       string
	Title      string
	Datasource *grafanaDatasource
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		Expr       string
		Datasource *grafanaDatasource
	}
}

func readDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	var d grafanaDashboard
	if err := json.Unmarshal([]byte(readFile(t, dashboardPath)), &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// dashboardExprs returns every PromQL expression of the dashboard, the
// variables' label_values queries as their selector, with Grafana's
// variables replaced by values PromQL parses.
func dashboardExprs(t *testing.T, d grafanaDashboard) map[string]string {
	t.Helper()
	vars := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*", "$instance", ".*")
	out := map[string]string{}
	for _, p := range d.Panels {
		for i, tg := range p.Targets {
			out[p.Title+" #"+string(rune('A'+i))] = vars.Replace(tg.Expr)
		}
	}
	lv := regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		m := lv.FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("variable %s: query %v is not label_values(SELECTOR, LABEL)", v.Name, v.Query)
		}
		// The label must be one of the selector's: match on it too.
		sel, label := m[1], m[2]
		if !strings.Contains(sel, "{") {
			sel += "{}"
		}
		out["variable "+v.Name] = vars.Replace(strings.Replace(sel, "{", "{"+label+`!="",`, 1))
	}
	return out
}

// TestMonitoring_MetricNames: every metric (and label) the alert rules and
// the dashboard use is one serve registers: renaming a metric breaks this.
func TestMonitoring_MetricNames(t *testing.T) {
	served := servedMetrics(t)
	for name, expr := range ruleExprs(t, rulesPath) {
		checkExpr(t, "rule "+name, expr, served)
	}
	d := readDashboard(t)
	exprs := dashboardExprs(t, d)
	for where, expr := range exprs {
		checkExpr(t, "dashboard "+where, expr, served)
	}
	// Words in the files' text that look like outbox metrics are ones too.
	for _, path := range []string{rulesPath, dashboardPath} {
		for _, m := range regexp.MustCompile(`\boutbox_[a-z0-9_]+`).FindAllString(readFile(t, path), -1) {
			base := m
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, cut := strings.CutSuffix(m, suffix); cut {
					if _, ok := served[b]; ok {
						base = b
					}
				}
			}
			if _, ok := served[base]; !ok {
				t.Errorf("%s names %s, which serve does not register", path, m)
			}
		}
	}
	// The dashboard shows what operators look for.
	var all strings.Builder
	for _, k := range slices.Sorted(maps.Keys(exprs)) {
		all.WriteString(exprs[k] + "\n")
	}
	for _, want := range []string{"outbox_deliveries_total", "outbox_delivery_latency_seconds_bucket", "outbox_provider_call_seconds_bucket",
		"outbox_queue_depth", "outbox_dead_letters_total", `state="unresolved"`, "outbox_lease_recoveries_total", "outbox_retries_total", "outbox_enqueued_total"} {
		if !strings.Contains(all.String(), want) {
			t.Errorf("the dashboard does not show %s", want)
		}
	}
}

// TestMonitoring_Dashboard: the dashboard is JSON Grafana imports, with a
// data source variable every panel and query uses.
func TestMonitoring_Dashboard(t *testing.T) {
	d := readDashboard(t)
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Fatal("no data source variable (name datasource, type datasource, query prometheus)")
	}
	ids := map[int]bool{}
	uses := func(where string, ds *grafanaDatasource) {
		if ds == nil || ds.UID != "${datasource}" || ds.Type != "prometheus" {
			t.Errorf("%s: data source %+v, want the variable ${datasource}", where, ds)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			uses("variable "+v.Name, v.Datasource)
		}
	}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
			t.Errorf("panel %q: grid position %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		uses("panel "+p.Title, p.Datasource)
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			uses("panel "+p.Title, tg.Datasource)
		}
	}
	if len(ids) < 10 {
		t.Fatalf("only %d panels", len(ids))
	}
}

// TestMonitoring_Promtool: promtool checks the rules and runs their unit
// tests, and parses every query of the dashboard (as recording rules).
func TestMonitoring_Promtool(t *testing.T) {
	promtool := linuxTool(t, "promtool", "prometheus")
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run(".", "check", "rules", rulesPath)
	run(filepath.Dir(rulesTestPath), "test", "rules", filepath.Base(rulesTestPath))

	exprs := dashboardExprs(t, readDashboard(t))
	keys := slices.Sorted(maps.Keys(exprs))
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, k := range keys {
		q, _ := json.Marshal(exprs[k])
		b.WriteString("      - record: dashboard:query" + string(rune('a'+i/26)) + string(rune('a'+i%26)) + "\n        expr: " + string(q) + "\n")
	}
	p := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	run(".", "check", "rules", p)
}
