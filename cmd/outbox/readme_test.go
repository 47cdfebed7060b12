package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The README's shell examples are run as a reader would run them: every
// ```sh block in order, pasted into one bash session, from a fresh
// directory that holds the checkout's testdata, with the built outbox
// first on PATH and none of outbox's variables set. A block whose first
// line is "# not run by the test: why" is counted, not run.

const readmePath = "../../README.md"

// notRunMarker opens a block the test does not run; the reason follows.
var notRunMarker = regexp.MustCompile(`^# not run by the test: (.+)$`)

// maxNotRun bounds the blocks the test may leave out.
const maxNotRun = 3

// wantExit reads the exit status a command announces at the end of its
// last line ("# exit 1: why"); 0 without one.
var wantExit = regexp.MustCompile(`\s# exit (\d+)\b[^'"]*$`)

// consoleLine is `outbox console …`, which runs until stopped: the test
// starts it on a free port, waits for the URL it prints, and stops it.
var consoleLine = regexp.MustCompile(`^(outbox console\b[^&#|;]*)(#.*)?$`)

// serveLine is `outbox serve … &`: the test starts it on a free port.
var serveLine = regexp.MustCompile(`^(outbox serve\b[^&#]*)&\s*(#.*)?$`)

// background is any other command left running with a trailing &.
var background = regexp.MustCompile(`[^&]&\s*(#.*)?$`)

// readmeAddrs are how the README names serve's default address.
var readmeAddrs = []string{"localhost:8080", "127.0.0.1:8080"}

type shBlock struct {
	line   int    // of the opening fence
	text   string // between the fences
	notRun string // the reason, for a block the test leaves out
}

type shCommand struct {
	block, line int // the block's fence line and the command's first line
	text        string
	want        int
}

// shBlocks returns the ```sh blocks of a Markdown file.
func shBlocks(t *testing.T, path string) []shBlock {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []shBlock
	var cur *shBlock
	var body []string
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && strings.TrimRight(l, " ") == "```sh":
			cur, body = &shBlock{line: i + 1}, nil
		case cur != nil && strings.TrimRight(l, " ") == "```":
			cur.text = strings.Join(body, "\n")
			if len(body) > 0 {
				if m := notRunMarker.FindStringSubmatch(body[0]); m != nil {
					cur.notRun = m[1]
				}
			}
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			body = append(body, l)
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: a sh block is never closed", path, cur.line)
	}
	return blocks
}

// complete reports whether bash would run text as it stands, as a
// terminal does when a pasted line ends a command (no open quote,
// construct or continuation).
func complete(t *testing.T, text string) bool {
	t.Helper()
	if strings.HasSuffix(text, "\\") {
		return false
	}
	var errb bytes.Buffer
	cmd := exec.Command("bash", "-n", "-c", text)
	cmd.Stderr = &errb
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("bash -n: %v", err)
	}
	return err == nil && errb.Len() == 0
}

// shCommands splits a block into the commands a terminal would run one by
// one; comments and blank lines between them are dropped.
func shCommands(t *testing.T, b shBlock) []shCommand {
	t.Helper()
	var out []shCommand
	var acc []string
	start := 0
	for i, l := range strings.Split(b.text, "\n") {
		if len(acc) == 0 {
			if s := strings.TrimSpace(l); s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			start = b.line + 1 + i
		}
		acc = append(acc, l)
		text := strings.Join(acc, "\n")
		if !complete(t, text) {
			continue
		}
		c := shCommand{block: b.line, line: start, text: text}
		if m := wantExit.FindStringSubmatch(l); m != nil {
			c.want, _ = strconv.Atoi(m[1])
		}
		out = append(out, c)
		acc = nil
	}
	if len(acc) > 0 {
		t.Fatalf("README:%d: this command never ends (an open quote or construct):\n%s", start, strings.Join(acc, "\n"))
	}
	return out
}

// The bash functions the session runs the commands with. __serve starts
// serve in the background on a free port and waits for its "listening on"
// line (or its exit); the EXIT trap stops it with SIGTERM, as a reader's
// Ctrl-C would. __console runs outbox console until it prints its URL,
// then stops it with SIGINT (Ctrl-C).
const readmePrelude = `
__serve() {
  rm -f "$__T/serve.fifo" && mkfifo "$__T/serve.fifo" || return 1
  "$@" --addr 127.0.0.1:0 >"$__T/serve.fifo" 2>&1 &
  __SERVE_PID=$!
  local line
  exec 3<"$__T/serve.fifo"
  while IFS= read -r line <&3; do
    printf '%s\n' "$line" >>"$__T/serve.log"
    case $line in "listening on http://"*) __ADDR=${line#listening on http://}; break;; esac
  done
  cat <&3 >>"$__T/serve.log" &
  exec 3<&-
  [ -n "${__ADDR:-}" ]
}
__console() {
  "$@" --addr 127.0.0.1:0 >"$__T/console.out" 2>&1 &
  local pid=$! i
  for i in $(seq 100); do grep -q 'login?key=' "$__T/console.out" && break; sleep 0.1; done
  kill -INT "$pid" 2>/dev/null; wait "$pid"; local rc=$?
  cat "$__T/console.out"
  grep -q 'login?key=' "$__T/console.out" && [ "$rc" = 0 ]
}
__stop() {
  if [ -n "${__SERVE_PID:-}" ]; then kill -TERM "$__SERVE_PID" 2>/dev/null; wait "$__SERVE_PID"; echo "__README_SERVE_EXIT $?"; fi
  wait
}
trap __stop EXIT
__check() {
  if [ "$1" != "$2" ]; then echo "__README_FAIL $3 $1"; exit 97; fi
}
`

// readmeScript turns the commands into one bash script: each one is
// announced, run, and its exit status checked against what it announces.
func readmeScript(t *testing.T, cmds []shCommand) string {
	t.Helper()
	var sb strings.Builder
	sb.WriteString(readmePrelude)
	serving := false
	for i, c := range cmds {
		text := c.text
		if m := serveLine.FindStringSubmatch(strings.TrimSpace(text)); m != nil {
			if serving {
				t.Fatalf("README:%d: a second outbox serve; the test runs one", c.line)
			}
			text, serving = "__serve "+strings.TrimSpace(m[1]), true
		} else if m := consoleLine.FindStringSubmatch(strings.TrimSpace(text)); m != nil {
			text = "__console " + strings.TrimSpace(m[1])
		} else if background.MatchString(text) {
			t.Fatalf("README:%d: a command left running in the background (only outbox serve & is):\n%s", c.line, text)
		}
		for _, a := range readmeAddrs {
			if strings.Contains(text, a) && !strings.HasPrefix(text, "__serve ") {
				if !serving {
					t.Fatalf("README:%d: talks to %s before a block starts outbox serve:\n%s", c.line, a, text)
				}
				text = strings.ReplaceAll(text, a, "${__ADDR}")
			}
		}
		fmt.Fprintf(&sb, "echo __README_CMD %d\n%s\n__check $? %d %d\n", i, text, c.want, i)
	}
	sb.WriteString("echo __README_DONE\n")
	return sb.String()
}

// readmeEnv is the test's environment as a reader's: outbox first on
// PATH, none of outbox's settings or secrets.
func readmeEnv(binDir, tmp string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "OUTBOX_") || strings.HasPrefix(k, "INTERNAL_OUTBOX_") || strings.HasPrefix(k, "RESEND_") || k == "PATH" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"), "__T="+tmp)
}

// splitOutput cuts the session's output at the command announcements.
func splitOutput(out string) (per map[int]string, failed, rc int, done bool, serveExit string) {
	per, failed, rc = map[int]string{}, -1, 0
	cur := -1
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "__README_CMD "):
			cur, _ = strconv.Atoi(strings.TrimPrefix(l, "__README_CMD "))
		case strings.HasPrefix(l, "__README_FAIL "):
			f := strings.Fields(l)
			failed, _ = strconv.Atoi(f[1])
			rc, _ = strconv.Atoi(f[2])
		case l == "__README_DONE":
			done = true
		case strings.HasPrefix(l, "__README_SERVE_EXIT "):
			serveExit = strings.TrimPrefix(l, "__README_SERVE_EXIT ")
		default:
			per[cur] += l + "\n"
		}
	}
	return
}

func TestReadme_ShellExamples(t *testing.T) {
	bin := buildBinary(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var cmds []shCommand
	var notRun []shBlock
	for _, b := range shBlocks(t, readmePath) {
		if b.notRun != "" {
			notRun = append(notRun, b)
			continue
		}
		cmds = append(cmds, shCommands(t, b)...)
	}
	for _, b := range notRun {
		t.Logf("README:%d not run: %s", b.line, b.notRun)
	}
	if len(notRun) > maxNotRun {
		t.Fatalf("%d README blocks are not run (at most %d): show commands the test can run", len(notRun), maxNotRun)
	}
	if len(cmds) == 0 {
		t.Fatal("the README has no sh block to run")
	}
	script := readmeScript(t, cmds)

	// The reader's checkout, as far as the examples read it.
	work, tmp := t.TempDir(), t.TempDir()
	if err := os.Symlink(filepath.Join(root, "testdata"), filepath.Join(work, "testdata")); err != nil {
		t.Fatal(err)
	}
	// A liveness bound, not a timing assertion.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = work
	cmd.Env = readmeEnv(filepath.Dir(bin), tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group, so that a hung session takes serve with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	runErr := cmd.Run()

	per, failed, rc, done, serveExit := splitOutput(out.String())
	serveLog, _ := os.ReadFile(filepath.Join(tmp, "serve.log"))
	if failed >= 0 {
		c := cmds[failed]
		t.Fatalf("README:%d (block at line %d) exited %d, want %d:\n%s\noutput:\n%s\nserve's log:\n%s", c.line, c.block, rc, c.want, c.text, per[failed], serveLog)
	}
	if !done || runErr != nil {
		t.Fatalf("the session ended early (%v); its output:\n%s\nserve's log:\n%s", runErr, out.String(), serveLog)
	}
	if serveExit != "" && serveExit != "0" {
		t.Fatalf("serve exited %s when stopped with SIGTERM; its log:\n%s", serveExit, serveLog)
	}
	t.Logf("ran %d README commands in order, %d blocks not run", len(cmds), len(notRun))
}

// mdLink is an inline Markdown link or image: its target up to a space,
// a fragment or the closing parenthesis.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// HTML comments and code (fenced or inline) hold no links a reader follows.
var htmlComment = regexp.MustCompile(`(?s)<!--.*?-->`)
var fenced = regexp.MustCompile("(?ms)^```.*?^```")
var inlineCode = regexp.MustCompile("`[^`\n]*`")

// headingAnchors are the fragments GitHub gives a Markdown file's headings.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	for _, l := range strings.Split(fenced.ReplaceAllString(text, ""), "\n") {
		h := strings.TrimLeft(l, "#")
		if h == l || !strings.HasPrefix(h, " ") {
			continue
		}
		a := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
		anchors[a] = true
	}
	return anchors
}

// Every relative link of the README and of docs/ names a file (and a
// heading, with a fragment) of the repository; none leaves it.
func TestDocs_RelativeLinksExist(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		if strings.Contains(string(b), "../shared/") {
			t.Errorf("%s names a file outside the repository (../shared/)", rel)
		}
		text := inlineCode.ReplaceAllString(fenced.ReplaceAllString(htmlComment.ReplaceAllString(string(b), ""), ""), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			abs := f
			if path != "" {
				abs = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
			}
			if r, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s: link %q leaves the repository", rel, target)
				continue
			}
			fi, err := os.Stat(abs)
			if err != nil {
				t.Errorf("%s: link %q: no such file", rel, target)
				continue
			}
			checked++
			if frag == "" || fi.IsDir() || !strings.HasSuffix(abs, ".md") {
				continue
			}
			tb, err := os.ReadFile(abs)
			if err != nil {
				t.Fatal(err)
			}
			if !headingAnchors(string(tb))[frag] {
				t.Errorf("%s: link %q: no heading #%s there", rel, target, frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the pattern is broken")
	}
}

// docs/configuration.md lists every flag of serve with its variable.
func TestDocs_ConfigurationListsEveryServeFlag(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	s := newSettings("serve", &env{Getenv: func(string) string { return "" }})
	addServeFlags(s)
	envOf := regexp.MustCompile(`\(env (\w+)\)`)
	n := 0
	s.fs.VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(doc, "| `--"+f.Name+"` |") {
			t.Errorf("docs/configuration.md has no row for --%s (%s)", f.Name, f.Usage)
		}
		if m := envOf.FindStringSubmatch(f.Usage); m != nil && !strings.Contains(doc, "`"+m[1]+"`") {
			t.Errorf("docs/configuration.md does not name %s (--%s)", m[1], f.Name)
		}
	})
	if n == 0 {
		t.Fatal("serve has no flags: the test reads the wrong flag set")
	}
}
