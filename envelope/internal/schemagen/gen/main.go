// Command gen writes envelope/schema_gen.go from envelope/schema.json
// (go generate in envelope runs it).
package main

import (
	"fmt"
	"os"

	"github.com/outboxhq/outbox/envelope/internal/schemagen"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gen SCHEMA.json OUT.go")
		os.Exit(2)
	}
	doc, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	src, err := schemagen.Generate(doc, "envelope")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(os.Args[2], src, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
