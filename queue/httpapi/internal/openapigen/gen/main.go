// Command gen writes queue/httpapi/openapi.json (go generate in
// queue/httpapi): gen SRC OUT.
package main

import (
	"fmt"
	"os"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/httpapi/internal/openapigen"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gen openapi.in.json openapi.json")
		os.Exit(2)
	}
	src, err := os.ReadFile(os.Args[1])
	if err == nil {
		var out []byte
		if out, err = openapigen.Build(src, envelope.Schema()); err == nil {
			err = os.WriteFile(os.Args[2], out, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
