package main

import (
	"strings"
	"testing"
)

// An empty ID or USER (a shell variable that was not set) is a usage
// error, not a lookup of "" (erase "" answered "erased default/").
func TestCLI_AnEmptyArgumentIsRefused(t *testing.T) {
	data := t.TempDir()
	if out, errs, code := runCmd(t, "demo", "--data", data); code != exitOK {
		t.Fatalf("demo = %d %s %s", code, out, errs)
	}
	for _, args := range [][]string{{"show", ""}, {"requeue", ""}, {"resolve", "", "--as", "sent"}, {"erase", ""}} {
		_, errs, code := runCmd(t, append(args, "--data", data)...)
		if code != exitUsage || !strings.Contains(errs, "an argument is empty") {
			t.Errorf("%v = %d %q, want a usage error", args, code, errs)
		}
	}
}

// doctor's closing advice for records gone from the logs says what to do
// with the unresolved rows among them (never claimed, so never ended by
// themselves), and never to rebuild.
func TestDoctorAdvice_RecordsGoneFromTheLogs(t *testing.T) {
	got := doctorAdvice([]string{"envelope record in logs/x.jsonl at 0 does not match its index entry"})
	for _, want := range []string{"do not rebuild", "settle them with outbox resolve"} {
		if !strings.Contains(got, want) {
			t.Errorf("advice %q lacks %q", got, want)
		}
	}
}
