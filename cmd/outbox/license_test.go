package main

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// apache20SHA256 is the SHA-256 of the Apache License 2.0 as published
// (https://www.apache.org/licenses/LICENSE-2.0.txt), appendix placeholders
// included.
const apache20SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"

// TestLicense: LICENSE is the Apache License 2.0, word for word, with only
// the appendix's copyright line filled in.
func TestLicense(t *testing.T) {
	text := readFile(t, "../../LICENSE")
	const ours, placeholder = "   Copyright 2026 The outbox authors\n", "   Copyright [yyyy] [name of copyright owner]\n"
	if strings.Count(text, ours) != 1 {
		t.Fatalf("LICENSE lacks the line %q", ours)
	}
	sum := sha256.Sum256([]byte(strings.Replace(text, ours, placeholder, 1)))
	if got := hex.EncodeToString(sum[:]); got != apache20SHA256 {
		t.Fatalf("LICENSE is not the Apache License 2.0 text (sha256 %s, want %s with the copyright line as published)", got, apache20SHA256)
	}
}
