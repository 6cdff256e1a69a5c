# Keel's build. `make test` is what CI runs (.ci/run).
GO        ?= go
BIN       := bin/keel
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/keel-dev/keel/cli.Version=$(VERSION)
# Fuzz budgets are counts, not durations: a duration races Go's fuzz
# coordinator on a busy machine (golang/go#75804, fixed in Go 1.27) and
# fails with a bare "context deadline exceeded".
FUZZRUNS  ?= 20000x

# Tests never depend on the developer's git configuration.
export GIT_CONFIG_GLOBAL := /dev/null
export GIT_CONFIG_NOSYSTEM := 1

.PHONY: all build build-freebsd vet-freebsd test fuzz lint bench demo grafana clean FORCE

all: lint build test

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/keel

## build-freebsd: static keel binaries for FreeBSD (docs/install-freebsd.md),
## bin/keel-freebsd-amd64 and bin/keel-freebsd-arm64.
FREEBSD_BINS := $(BIN)-freebsd-amd64 $(BIN)-freebsd-arm64

build-freebsd: $(FREEBSD_BINS)

$(FREEBSD_BINS): FORCE
	CGO_ENABLED=0 GOOS=freebsd GOARCH=$(patsubst $(BIN)-freebsd-%,%,$@) \
		$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/keel

## vet-freebsd: go vet as the FreeBSD build sees the code (its build tags).
vet-freebsd:
	GOOS=freebsd $(GO) vet ./...

FORCE:

## test: the unit, golden and end-to-end tests under the race detector, then
## a short run of each fuzz target.
# The timeout leaves room for a busy machine: the end-to-end tests stretch
# their deadlines by the CPU contention they measure.
test:
	$(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) --no-print-directory fuzz

fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzRender$$' -fuzztime=$(FUZZRUNS) ./render
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$(FUZZRUNS) ./report
	$(GO) test -run='^$$' -fuzz='^FuzzPushRef$$' -fuzztime=$(FUZZRUNS) ./sync
	$(GO) test -run='^$$' -fuzz='^FuzzAuthenticate$$' -fuzztime=$(FUZZRUNS) ./sync
	$(GO) test -run='^$$' -fuzz='^FuzzCommitFS$$' -fuzztime=$(FUZZRUNS) ./sync
	$(GO) test -run='^$$' -fuzz='^FuzzParseMeta$$' -fuzztime=$(FUZZRUNS) ./providers/certshare
	$(GO) test -run='^$$' -fuzz='^FuzzParseJails$$' -fuzztime=$(FUZZRUNS) ./nodeexec/freebsd
	$(GO) test -run='^$$' -fuzz='^FuzzParsePS$$' -fuzztime=$(FUZZRUNS) ./nodeexec/freebsd
	$(GO) test -run='^$$' -fuzz='^FuzzParseMounts$$' -fuzztime=$(FUZZRUNS) ./nodeexec/freebsd
	$(GO) test -run='^$$' -fuzz='^FuzzParseZFSList$$' -fuzztime=$(FUZZRUNS) ./nodeexec/freebsd
	$(GO) test -run='^$$' -fuzz='^FuzzParseSysctl$$' -fuzztime=$(FUZZRUNS) ./nodeexec/freebsd
	$(GO) test -run='^$$' -fuzz='^FuzzParseRctl$$' -fuzztime=$(FUZZRUNS) ./nodeexec/freebsd
	$(GO) test -run='^$$' -fuzz='^FuzzParseConfig$$' -fuzztime=$(FUZZRUNS) ./providers/dns01

STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

## bench: every benchmark, printed as a table (figures go to docs/benchmarks.md).
BENCHTIME ?= 5x
bench:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) ./... | tee bench.out | \
	awk 'BEGIN { printf "%-40s %12s %12s %14s %12s\n", "benchmark", "ms/op", "instances", "B/op", "allocs/op" } \
	     /^Benchmark/ { inst = "-"; for (i = 3; i < NF; i++) { if ($$(i+1) == "ns/op") ms = $$i / 1e6; if ($$(i+1) == "instances") inst = $$i; \
	       if ($$(i+1) == "B/op") by = $$i; if ($$(i+1) == "allocs/op") al = $$i } \
	       printf "%-40s %12.1f %12s %14s %12s\n", $$1, ms, inst, by, al }'

## demo: a local three-node cluster on the process driver, deployed by git
## push (Ctrl-C stops it and every instance).
demo: build
	./$(BIN) demo

## grafana: regenerate docs/grafana/keel.json from docs/grafana/dashboard.go
## (a test fails while the checked-in JSON differs).
grafana:
	cd docs/grafana && $(GO) run ./gen keel.json

clean:
	rm -rf bin bench.out
