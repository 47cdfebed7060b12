package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// The whole example runs: consent, enqueue, delivery, and the e-mail's
// unsubscribe link accepted by the handler.
func TestEmbed(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), t.TempDir(), &out); err != nil {
		t.Fatal(err)
	}
	want := "enqueued: digest/u_42/2026-W49 duplicate: false\nstatus: delivered\none-click unsubscribe: 200 digest_enabled: false\n"
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

// The README's library snippet is this example's code between its README
// markers, as written (one indentation level less, tabs as 4 spaces).
func TestEmbed_ReadmeIsTheExample(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok1 := strings.Cut(string(src), "\t// README begin\n")
	body, _, ok2 := strings.Cut(rest, "\t// README end\n")
	if !ok1 || !ok2 {
		t.Fatal("main.go lacks its README markers")
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		l = strings.TrimPrefix(l, "\t")
		n := len(l) - len(strings.TrimLeft(l, "\t"))
		lines = append(lines, strings.Repeat("    ", n)+l[n:])
	}
	want := strings.Join(lines, "\n")

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, _ := strings.Cut(string(readme), "## Use as a library\n")
	_, block, _ := strings.Cut(sec, "```go\n")
	block, _, _ = strings.Cut(block, "```")
	if strings.TrimRight(block, "\n") != want {
		t.Fatalf("README's library snippet is not examples/embed/main.go's; put this in it:\n%s", want)
	}
}
