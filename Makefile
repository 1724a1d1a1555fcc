# titan: build, test, benchmark and lint entry points.
GO      ?= go
BIN     ?= bin/titan
RECIPE  ?= recipes/llama3_debug.toml
PKGS    := ./...
# VERSION is stamped into the binary (internal/version), recorded with every run.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null)
LDFLAGS := $(if $(VERSION),-X github.com/titan-go/titan/internal/version.Version=$(VERSION))

.PHONY: gpu-check
.PHONY: all build train test test-race fuzz bench bench-gemm bench-bf16 bench-step bench-comm bench-generate bench-aggify bench-checkpoint lint fmt vet clean golden

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/titan

## train: the main job — trains the debug Llama on the built-in corpus.
train: build
	./$(BIN) train --recipe $(RECIPE)

## test: the whole suite (what CI runs).
test:
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/titan   # titan builds without cgo too (no CUDA backend, no aggify)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) test -count=1 -timeout 15m $(PKGS)

## test-race: the suite under the race detector (slower).
test-race:
	$(GO) test -race -count=1 -timeout 30m $(PKGS)

## fuzz: every Go fuzz target of the repository, one after the other, each
## for FUZZTIME (their seed corpora also run in `make test`); new inputs are
## minimized for at most FUZZMINTIME (the default 60 s stalls slow targets).
FUZZTIME ?= 30s
FUZZMINTIME ?= 5s
fuzz:
	@set -e; for f in $$(git ls-files '*_test.go' | xargs grep -l '^func Fuzz'); do \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== ./$$(dirname $$f) $$t ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINTIME) ./$$(dirname $$f); \
		done; \
	done

## gpu-check: the CUDA backend's checks on a machine with an NVIDIA GPU and
## PyTorch (scripts/gpu-check.sh, about 8 minutes): parity of every kernel
## with the CPU backend, a 1B Llama trained in bfloat16 (tokens/s, MFU) and
## PyTorch eager on the same GPU side by side. Results under $$OUT if set.
gpu-check:
	bash scripts/gpu-check.sh

## bench: Go micro-benchmarks of the compute core.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x ./internal/...

## bench-gemm: titan's SGEMM against OpenBLAS, side by side.
bench-gemm:
	bash bench/openblas/compare.sh

## bench-bf16: the bf16 GEMM against titan's float32 GEMM and PyTorch's
## float32 and bfloat16 matmul on the linear-layer shapes, 1 and 2 threads.
bench-bf16:
	bash bench/gemm_bf16/compare.sh

## bench-step: training-step throughput against PyTorch, side by side.
bench-step: build
	bash bench/step/compare.sh

## bench-comm: allreduce bus bandwidth against PyTorch's Gloo, side by side.
bench-comm:
	bash bench/gloo/compare.sh

## bench-checkpoint: how long a save blocks the training loop (each
## checkpoint.async_mode, debug model) and save/load throughput against dd
## on the same disk, side by side (bench/checkpoint).
bench-checkpoint: build
	bash bench/checkpoint/compare.sh

## bench-aggify: a cursor loop (Go client over fetched rows, PL/pgSQL) against
## its Aggify rewrite on a throwaway PostgreSQL and on SQLite, 1,000 runs ×
## 1,000 steps.
bench-aggify:
	$(GO) test -run '^$$' -bench Aggify -benchtime 2x ./internal/aggify

## bench-generate: Hyena generation, flash against lazy and eager long
## convolutions, 2^10..2^17 positions (about 10 minutes; bench/generate).
bench-generate: build
	./$(BIN) bench generate --recipe recipes/hyena_debug.toml --set model.flavor=long \
		--length 131072 --mode lazy,eager,flash --threads 1 --slow-max 131072 \
		--plot bench/generate/time_vs_length.png

## golden: regenerate the PyTorch parity files, llama and hyena (needs /usr/bin/python3 with torch).
golden:
	/usr/bin/python3 internal/model/llama/testdata/reference.py
	/usr/bin/python3 internal/model/hyena/testdata/reference.py

lint: vet fmt
vet:
	$(GO) vet $(PKGS)
fmt:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

clean:
	rm -rf bin
