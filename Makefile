# outbox — make help lists the targets.
GO       ?= go
PKGS     ?= ./...
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
DATA     ?= ./data
FUZZTIME ?= 10s

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-z][a-zA-Z0-9_-]*:.*## /{printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/outbox
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/outbox ./cmd/outbox

.PHONY: completion
completion: build ## write the bash and zsh completion scripts to bin/completion/ (docs/operations-files.md says where they go)
	@mkdir -p bin/completion
	bin/outbox completion bash > bin/completion/outbox.bash
	bin/outbox completion zsh > bin/completion/_outbox

.PHONY: test
test: cross ## go vet, the cross-builds, then every test with -race -shuffle=on (what CI runs)
	$(GO) vet $(PKGS)
	$(GO) test -race -shuffle=on -timeout 15m $(PKGS)

# The tests run on Linux; the module must also build (test files included)
# for the other systems a homelab box or a developer's laptop runs.
CROSS ?= darwin freebsd

.PHONY: cross
cross: ## build and vet (which compiles the test files too) for each of CROSS
	@set -e; for os in $(CROSS); do \
	  echo "GOOS=$$os go build $(PKGS) && go vet $(PKGS)"; \
	  GOOS=$$os GOARCH=amd64 $(GO) build $(PKGS); \
	  GOOS=$$os GOARCH=amd64 $(GO) vet $(PKGS); \
	done

.PHONY: demo
demo: ## run the whole delivery loop once on ./data with the sink provider (no credentials)
	$(GO) run ./cmd/outbox demo --data $(DATA)

.PHONY: bench
bench: ## Go benchmarks, then outbox bench
	$(GO) test -p 1 -run '^$$' -bench . -benchtime 2000x ./queue/... ./cmd/...
	$(GO) run ./cmd/outbox bench

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s $$pkg; \
	  done; done

.PHONY: cover
cover: ## test coverage summary (cover.out)
	$(GO) test -coverprofile=cover.out $(PKGS)
	$(GO) tool cover -func=cover.out | tail -n 1

.PHONY: lint
lint: ## staticcheck (pinned with the go.mod tool directive)
	$(GO) tool staticcheck $(PKGS)
.PHONY: preview
preview: ## render every golden fixture into ./preview/ (open preview/index.html)
	$(GO) run ./cmd/outbox render --out preview --base-url https://app.example.org testdata/delivery/*.golden.json
	$(GO) run ./cmd/outbox render --out preview --base-url https://app.example.org --channel email testdata/delivery/resurface-nudge.v1.golden.json

.PHONY: e2e
e2e: ## opt-in tests against the real services (OUTBOX_E2E_* variables; skipped otherwise)
	$(GO) test -count=1 -run E2E -v ./channels/...

.PHONY: drill
drill: ## the long kill drill: SIGKILL outbox serve 50 times under load, then check nothing was lost or sent twice (STORE=postgres: on PostgreSQL)
	OUTBOX_DRILL_KILLS=$${KILLS:-50} OUTBOX_DRILL_STORE=$(STORE) $(GO) test -count=1 -timeout 30m -run 'TestDrill_Kill$$' -v ./cmd/outbox/

.PHONY: faults
faults: ## the fault drill: 200 faults (FAULTS=…; SEED=… repeats a sequence) under load through outbox serve; table in bin/faults-report.md
	@mkdir -p bin
	OUTBOX_FAULTS=$${FAULTS:-200} OUTBOX_FAULTS_SEED=$(SEED) OUTBOX_FAULTS_REPORT=$(CURDIR)/bin/faults-report.md $(GO) test -count=1 -timeout 60m -run 'TestDrill_Faults$$' -v ./cmd/outbox/

.PHONY: powercut
powercut: ## the power-cut drill: serve on a crash file system, the power cut CUTS times (30) under load; nothing unsynced survives (root, /dev/fuse)
	OUTBOX_POWERCUT=$${CUTS:-30} $(GO) test -count=1 -timeout 30m -run '^TestDrill_PowerCut$$|^TestWriteDurable' -v ./cmd/outbox/ ./internal/crashfs/

.PHONY: index-faults
index-faults: ## the index fault tests with more rounds (ROUNDS=30): killed rebuilds, compact racing serve, corruptions
	OUTBOX_INDEX_FAULT_ROUNDS=$${ROUNDS:-30} $(GO) test -count=1 -timeout 30m -run '^TestFault_|^TestOpen_CorruptIndexNeverCrashes$$' -v ./cmd/outbox/ ./queue/filestore/

.PHONY: diff
diff: ## long differential run: every store against the reference model (SEEDS=2000, STEPS=120; PostgreSQL too)
	OUTBOX_DIFF_SEEDS=$${SEEDS:-2000} OUTBOX_DIFF_STEPS=$${STEPS:-120} OUTBOX_DIFF_REPORTS=$${REPORTS:-20} $(GO) test -count=1 -timeout 60m -run '^TestDifferential$$' -v ./queue/queuetest/ ./queue/pgstore/

.PHONY: pg-contention
pg-contention: ## the PostgreSQL store's contention test, enqueueing for PGTIME (20s): 8 claimers on two pools and a reconciler
	OUTBOX_PG_CONTENTION=$${PGTIME:-20s} $(GO) test -count=1 -timeout 30m -run '^TestContention$$' -v ./queue/pgstore/

.PHONY: soak
soak: ## a steady-rate soak with failing and hanging providers (SOAK=3m), then checks resources and losses
	OUTBOX_SOAK_DURATION=$${SOAK:-3m} $(GO) test -count=1 -timeout 30m -run '^TestSoak$$' -v ./queue/worker/

.PHONY: scale
scale: ## 1,000,000 pending rows over 1,000 users: Open time, Go heap, idle CPU (ROWS=…, USERS=…)
	OUTBOX_SCALE_ROWS=$${ROWS:-1000000} OUTBOX_SCALE_USERS=$${USERS:-1000} $(GO) test -count=1 -timeout 60m -run '^TestScale$$' -v ./queue/filestore/
