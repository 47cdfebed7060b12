package main

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/httpapi"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// Tests of the binary on the PostgreSQL store (pgtest's server: a
// throwaway one, or OUTBOX_TEST_DATABASE_URL).

// usePG makes every command this test runs, in-process or as a child
// process, use the PostgreSQL store in schema.
func usePG(t *testing.T, schema string) {
	t.Setenv(EnvDatabaseURL, pgtest.DSN())
	t.Setenv("OUTBOX_DATABASE_SCHEMA", schema)
}

// pgEnv is the environment of a command on schema (for outboxEnv and launchServe).
func pgEnv(schema string) []string {
	return []string{EnvDatabaseURL + "=" + pgtest.DSN(), "OUTBOX_DATABASE_SCHEMA=" + schema}
}

// outboxEnv runs the binary with env added to the environment; it returns
// stdout and stderr together and the exit code.
func outboxEnv(t *testing.T, bin string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

// runIn runs a command in this process with vars as its whole environment.
func runIn(vars map[string]string, args ...string) (string, int) {
	var out bytes.Buffer
	e := &env{Stdout: &out, Stderr: &out, Getenv: func(k string) string { return vars[k] }}
	code := run(context.Background(), e, args)
	return out.String(), code
}

func randHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// chatJSON is a telegram reply to chat whose text is long enough for segs
// segments (4096 UTF-16 units each).
func chatJSON(id, user string, segs int) []byte {
	text := "hello from " + id + " " + strings.Repeat("lorem ", ((segs-1)*4096+100)/6)
	b, _ := json.Marshal(map[string]any{
		"schema_version": "1", "id": id, "user_id": user, "channel": "telegram", "template": "reply-text.v1",
		"recipient": map[string]any{"chat_id": "424242"}, "payload": map[string]any{"text": text},
		"created_at": "2026-11-01T00:00:00Z",
	})
	return b
}

// The DSN's sources: the flag wins over the environment, the variable and
// its _FILE are exclusive, the file's content is trimmed; without any the
// file store is used (migrate refuses).
func TestPG_DSNSources(t *testing.T) {
	schema := pgtest.Schema(t)
	file := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(file, []byte("\n  "+pgtest.DSN()+"  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := "postgres://nobody:x@127.0.0.1:1/none?connect_timeout=5"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
		code int
	}{
		{"env", map[string]string{EnvDatabaseURL: pgtest.DSN()}, nil, "migrated to version", 0},
		{"file, trimmed", map[string]string{EnvDatabaseURL + "_FILE": file}, nil, "up to date", 0},
		{"the flag wins", map[string]string{EnvDatabaseURL: bad}, []string{"--database-url", pgtest.DSN()}, "up to date", 0},
		{"both URL and FILE", map[string]string{EnvDatabaseURL: pgtest.DSN(), EnvDatabaseURL + "_FILE": file}, nil, "set only one of OUTBOX_DATABASE_URL and OUTBOX_DATABASE_URL_FILE", 1},
		{"a missing file", map[string]string{EnvDatabaseURL + "_FILE": file + ".gone"}, nil, "read OUTBOX_DATABASE_URL_FILE", 1},
		{"none", map[string]string{}, nil, "migrate needs a PostgreSQL store", 1},
		{"the env's server is down", map[string]string{EnvDatabaseURL: bad}, nil, "cannot connect to the database", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := runIn(tc.env, append([]string{"migrate", "--database-schema", schema}, tc.args...)...)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("migrate = %d %q, want %d and %q", code, out, tc.code, tc.want)
			}
		})
	}
	// -help never prints the environment's DSN as the flag's default.
	out, _ := runIn(map[string]string{EnvDatabaseURL: bad}, "serve", "-help")
	if strings.Contains(out, "127.0.0.1:1") || !strings.Contains(out, "-database-url") {
		t.Fatalf("serve -help shows the DSN or lacks the flag:\n%s", out)
	}
}

// outbox serve on PostgreSQL runs the whole product: enqueue over HTTP and
// with outbox enqueue, delivery (several segments), consent, the operator
// commands straight on the database, doctor; the file-only commands
// refuse, and --no-migrate refuses an unmigrated schema.
func TestPG_ServeAndOperate(t *testing.T) {
	bin := buildBinary(t)
	schema := pgtest.Schema(t)
	env := pgEnv(schema)
	data := t.TempDir()
	const token = "pg-token-0123456789abcdef"

	// Not migrated: serve --no-migrate refuses, naming outbox migrate.
	d, out, code := launchServe(t, bin, data, append(env, "INTERNAL_OUTBOX_TOKEN="+token), "--no-migrate")
	if d != nil || code == 0 || !strings.Contains(out, "outbox migrate") {
		t.Fatalf("serve --no-migrate on an empty schema = %d %q", code, out)
	}
	if out, code := outboxEnv(t, bin, env, "ls"); code == 0 || !strings.Contains(out, "outbox migrate") {
		t.Fatalf("ls on an empty schema = %d %q", code, out)
	}
	if out, code := outboxEnv(t, bin, env, "doctor"); code == 0 || !strings.Contains(out, "migration(s) pending") {
		t.Fatalf("doctor on an empty schema = %d %q", code, out)
	}
	want := "version " + strconv.Itoa(pgstore.SchemaVersion())
	if out, code := outboxEnv(t, bin, env, "migrate"); code != 0 || !strings.Contains(out, "migrated to "+want) {
		t.Fatalf("migrate = %d %q", code, out)
	}
	if out, code := outboxEnv(t, bin, env, "migrate"); code != 0 || !strings.Contains(out, "at "+want+": up to date") {
		t.Fatalf("migrate again = %d %q", code, out)
	}

	d, out, _ = launchServe(t, bin, data, append(env, "INTERNAL_OUTBOX_TOKEN="+token), "--no-migrate", "--lease", "2s")
	if d == nil {
		t.Fatalf("serve --no-migrate on a migrated schema:\n%s", out)
	}
	if _, err := os.Lstat(filepath.Join(data, SocketName)); err == nil {
		t.Error("serve on PostgreSQL listens on the operator socket")
	}
	if code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON("pg-1", "u1", 3)); code != http.StatusCreated || !strings.Contains(string(b), `"segments":3`) {
		t.Fatalf("POST = %d %s", code, b)
	}
	if code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON("pg-1", "u1", 3)); code != http.StatusOK {
		t.Fatalf("duplicate POST = %d %s", code, b)
	}
	f := filepath.Join(t.TempDir(), "env.json")
	os.WriteFile(f, replyJSON("cli-1", "u2"), 0o600)
	if out, code := outboxEnv(t, bin, env, "enqueue", f); code != 0 || !strings.Contains(out, "queued default/cli-1") {
		t.Fatalf("enqueue = %d %s", code, out)
	}
	if out, code := outboxEnv(t, bin, env, "enqueue", f); code != 0 || !strings.Contains(out, "duplicate default/cli-1") {
		t.Fatalf("enqueue again = %d %s", code, out)
	}
	if out, code := outboxEnv(t, bin, env, "enqueue", "--json", f); code != 0 || !strings.Contains(out, `"status": "duplicate"`) {
		t.Fatalf("enqueue --json again = %d %s", code, out)
	}
	sent := func(id string) bool {
		code, b := request(t, "GET", d.base+"/v1/envelopes/"+id, token, nil)
		return code == 200 && strings.Contains(string(b), `"status":"delivered"`)
	}
	eventually(t, "pg-1 delivered", func() bool { return sent("pg-1") })
	eventually(t, "cli-1 delivered", func() bool { return sent("cli-1") })
	if files, _ := filepath.Glob(filepath.Join(data, "sink", "telegram", "*.json")); len(files) != 4 {
		t.Fatalf("sink has %d telegram messages, want 4 (3 segments and 1)", len(files))
	}

	// Consent over HTTP, read by the operator command.
	if code, b := request(t, "PUT", d.base+"/v1/consent/u3", token, []byte(`{"digest_enabled":true,"push_enabled":true,"email_verified":true,"cadence":"weekly"}`)); code != 200 {
		t.Fatalf("PUT consent = %d %s", code, b)
	}
	// A push subscription, and the one-click unsubscribe of u3's e-mail
	// (a link signed with the key in --data), both into the database.
	pk, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sub, _ := json.Marshal(map[string]any{"endpoint": "https://push.example.org/send/abc", "keys": map[string]string{
		"p256dh": base64.RawURLEncoding.EncodeToString(pk.PublicKey().Bytes()), "auth": base64.RawURLEncoding.EncodeToString([]byte("0123456789abcdef"))}})
	if code, b := request(t, "POST", d.base+"/api/app/push/subscribe?user=u3", token, sub); code != http.StatusCreated {
		t.Fatalf("push subscribe = %d %s", code, b)
	}
	var subs int
	if err := pgtest.Admin().QueryRow(context.Background(), `SELECT count(*) FROM `+schema+`.subscriptions`).Scan(&subs); err != nil || subs != 1 {
		t.Fatalf("subscriptions in the database: %d, %v", subs, err)
	}
	key, err := httpapi.LoadOrCreateKey(data)
	if err != nil {
		t.Fatal(err)
	}
	link := httpapi.NewUnsubscriber(key, d.base).Token(envelope.DefaultTenant, "u3", envelope.ChannelEmail, "ref-u3")
	if code, b := request(t, "POST", d.base+"/unsubscribe/"+link, "", nil); code != http.StatusOK {
		t.Fatalf("one-click unsubscribe = %d %s", code, b)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"consent", "show", "u3"}, "suppressed email"},
		{[]string{"show", "pg-1"}, "DELIVERED"},
		{[]string{"ls", "--state", "sent"}, "cli-1"},
		{[]string{"stats"}, "sent"},
		{[]string{"consent", "set", "u4", "--push"}, "push_enabled=true"},
		{[]string{"suppressions", "add", "bounce@example.org"}, "suppressed bounce@example.org"},
		{[]string{"suppressions", "list"}, "bounced"},
		{[]string{"erase", "u2"}, "erased default/u2"},
		{[]string{"doctor"}, "unresolved 0"},
		{[]string{"doctor", "--json"}, `"schema_version": ` + strconv.Itoa(pgstore.SchemaVersion())},
	} {
		if out, code := outboxEnv(t, bin, env, c.args...); code != 0 || !strings.Contains(out, c.want) {
			t.Fatalf("outbox %v = %d %q, want %q", c.args, code, out, c.want)
		}
	}
	if out, code := outboxEnv(t, bin, env, "show", "cli-1"); code == 0 || !strings.Contains(out, "not found") {
		t.Fatalf("show after erase = %d %q", code, out)
	}
	if out, code := outboxEnv(t, bin, env, "requeue", "pg-1"); code != 1 {
		t.Fatalf("requeue of a delivered envelope = %d %s", code, out)
	}
	for _, args := range [][]string{{"compact"}, {"path", "--user", "u1"}, {"doctor", "--rebuild"}} {
		if out, code := outboxEnv(t, bin, env, args...); code == 0 || !strings.Contains(out, "file store only") {
			t.Fatalf("outbox %v on PostgreSQL = %d %q, want a refusal", args, code, out)
		}
	}
	if out, code := outboxEnv(t, bin, env, "ls", "--quarantine"); code == 0 || !strings.Contains(out, "file store only") {
		t.Fatalf("ls --quarantine on PostgreSQL = %d %q", code, out)
	}
	if code, b := request(t, "GET", d.base+"/metrics", "", nil); code != 200 || !strings.Contains(string(b), `outbox_enqueued_total{channel="telegram"} 1`) {
		t.Fatalf("metrics = %d %s", code, b)
	}
	d.stop(t)
	// The file store was never touched.
	if _, err := os.Stat(filepath.Join(data, "index.db")); err == nil {
		t.Error("serve on PostgreSQL created index.db")
	}
}

// The DSN is a secret: a canary password in it never shows in any output
// of serve, migrate, the operator commands or doctor, nor in /metrics or an
// HTTP response, whether the server accepts it, refuses the password,
// cannot be reached, or the URL does not parse.
func TestPG_DSNCanary(t *testing.T) {
	if !pgtest.Private() {
		t.Skip("needs pgtest's throwaway server (its password-only role); " + pgtest.EnvURL + " names another")
	}
	bin := buildBinary(t)
	ctx := context.Background()
	pw := "canary" + randHex(t, 12)
	role := "canary_" + randHex(t, 4)
	if _, err := pgtest.Admin().Exec(ctx, `CREATE ROLE `+role+` LOGIN SUPERUSER PASSWORD '`+pw+`'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pgtest.Admin().Exec(context.Background(), `DROP OWNED BY `+role+` CASCADE`)
		_, _ = pgtest.Admin().Exec(context.Background(), `DROP ROLE `+role)
	})
	schema := pgtest.Schema(t)
	good := pgtest.DSN() + " user=" + role + " password=" + pw // later keys win
	secretParts := []string{pw, good}
	check := func(what, out string) {
		t.Helper()
		for _, s := range secretParts {
			if strings.Contains(out, s) {
				t.Fatalf("%s shows the DSN's secret:\n%s", what, out)
			}
		}
	}

	data := t.TempDir()
	envFile := filepath.Join(t.TempDir(), "env.json")
	os.WriteFile(envFile, replyJSON("c-0", "u1"), 0o600)
	for _, bad := range []struct{ name, dsn, want string }{
		{"wrong password", pgtest.DSN() + " user=" + pgtest.PasswordUser + " password=" + pw, "password authentication failed"},
		{"no server", "host=127.0.0.1 port=1 user=" + role + " password=" + pw + " dbname=postgres sslmode=disable connect_timeout=5", "cannot connect to the database"},
		{"bad URL", "postgres://" + role + ":" + pw + "@127.0.0.1:notaport/postgres", "does not parse"},
	} {
		env := []string{EnvDatabaseURL + "=" + bad.dsn, "OUTBOX_DATABASE_SCHEMA=" + schema}
		for _, args := range [][]string{{"migrate"}, {"ls"}, {"stats"}, {"doctor"}, {"consent", "show", "u1"}, {"enqueue", envFile},
			{"bench", "--store", "postgres", "-n", "1", "--only", "p1"}} {
			out, code := outboxEnv(t, bin, env, args...)
			check(bad.name+": outbox "+args[0], out)
			if code == 0 || !strings.Contains(out, bad.want) {
				t.Errorf("%s: outbox %v = %d %q, want a failure saying %q", bad.name, args, code, out, bad.want)
			}
		}
		d, out, code := launchServe(t, bin, data, env)
		if d != nil {
			d.kill()
			t.Fatalf("%s: serve started", bad.name)
		}
		check(bad.name+": serve", out)
		if code == 0 || !strings.Contains(out, bad.want) {
			t.Errorf("%s: serve = %d %q, want %q", bad.name, code, out, bad.want)
		}
	}

	// The good DSN, from a file for migrate and from the variable for the rest.
	file := filepath.Join(t.TempDir(), "dsn")
	os.WriteFile(file, []byte(good+"\n"), 0o600)
	out, code := outboxEnv(t, bin, []string{EnvDatabaseURL + "_FILE=" + file, "OUTBOX_DATABASE_SCHEMA=" + schema}, "migrate")
	check("migrate", out)
	if code != 0 {
		t.Fatalf("migrate = %d %s", code, out)
	}
	env := []string{EnvDatabaseURL + "=" + good, "OUTBOX_DATABASE_SCHEMA=" + schema}
	const token = "canary-token-0123456789abcdef"
	d, out, _ := launchServe(t, bin, data, append(env, "INTERNAL_OUTBOX_TOKEN="+token), "--log-format", "json")
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	var bodies []string
	for _, r := range []struct {
		method, path string
		body         []byte
	}{
		{"POST", "/v1/envelopes", replyJSON("c-1", "u1")},
		{"POST", "/v1/envelopes", []byte(`{"id":"bad"}`)},
		{"GET", "/v1/envelopes/c-1", nil},
		{"GET", "/v1/envelopes/nope", nil},
		{"GET", "/v1/stats", nil},
		{"PUT", "/v1/consent/u2", []byte(`{"digest_enabled":true}`)},
		{"GET", "/v1/consent/u2", nil},
		{"GET", "/unsubscribe/not-a-token", nil},
		{"GET", "/healthz", nil},
		{"GET", "/readyz", nil},
		{"GET", "/metrics", nil},
	} {
		code, b := request(t, r.method, d.base+r.path, token, r.body)
		check(r.method+" "+r.path, string(b))
		bodies = append(bodies, r.path+" "+strconv.Itoa(code))
	}
	// The LISTEN connection lost: serve logs it and reconnects.
	if _, err := pgtest.Admin().Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1`, `LISTEN "outbox_wake_`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lost LISTEN logged", func() bool { return strings.Contains(d.logs.String(), "listen connection lost") })
	for _, args := range [][]string{{"ls"}, {"show", "c-1"}, {"show", "nope"}, {"stats"}, {"doctor"}, {"doctor", "--json"}, {"consent", "show", "u2"},
		{"requeue", "c-1"}, {"suppressions", "list"}, {"erase", "u9"}, {"compact"}} {
		out, _ := outboxEnv(t, bin, env, args...)
		check("outbox "+strings.Join(args, " "), out)
	}
	d.stop(t)
	check("serve's log", d.logs.String())
	t.Logf("HTTP answers checked: %v", bodies)
}

// serve on PostgreSQL without any provider (the seam only): a lease of
// /internal/outbox/pending that expires returns its envelope to pending
// (no built-in worker recovers it), and the next caller gets it again.
func TestPG_SeamLeaseReturns(t *testing.T) {
	bin := buildBinary(t)
	schema := pgtest.Schema(t)
	const token = "seam-token-0123456789abcdef"
	d, out, _ := launchServe(t, bin, t.TempDir(), append(pgEnv(schema), "INTERNAL_OUTBOX_TOKEN="+token), "--no-sink", "--seam-lease", "1s")
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	postSeamDigest(t, d.base, token)
	lease := func() (uint64, bool) {
		_, b := request(t, "GET", d.base+"/internal/outbox/pending?channel=email", token, nil)
		var p struct {
			Leases []struct {
				Fence uint64 `json:"fence"`
			} `json:"leases"`
		}
		if json.Unmarshal(b, &p) != nil || len(p.Leases) != 1 {
			return 0, false
		}
		return p.Leases[0].Fence, true
	}
	first, ok := lease()
	if !ok {
		t.Fatal("the envelope was not handed out")
	}
	var again uint64
	eventually(t, "the expired seam lease returned to pending and handed out again", func() bool {
		f, ok := lease()
		again = f
		return ok
	})
	if again <= first {
		t.Fatalf("handed out again with fence %d after %d", again, first)
	}
	if _, b := request(t, "GET", d.base+"/metrics", "", nil); !strings.Contains(string(b), "outbox_seam_leases_expired_total 1") {
		t.Errorf("metrics: no expired seam lease counted")
	}
	d.stop(t)
}
