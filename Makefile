# kscope — the two commands a new user runs: `make demo` and `make test`.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
BIN         := $(CURDIR)/bin
MODULES     := . integration bench kscopetest/containers
# The race detector multiplies memory and time; the suites are sized for it.
TESTFLAGS   ?= -race -count=1 -timeout 15m

.PHONY: all demo build test vet staticcheck test-unit test-integration test-kafka test-containers reliability bench bench-quick fmt

all: test

## demo: the payments ledger through crashes, poison, retries, gaps and a replay (kfake + local PostgreSQL)
demo:
	$(GO) run ./examples/payments

## build: the kscope CLI, as bin/kscope
build:
	$(GO) build -o $(BIN)/kscope ./cmd/kscope

## test: vet, staticcheck, then every unit and integration test with -race
test: vet staticcheck test-unit test-consumer-protocol test-integration

vet:
	@for m in $(MODULES); do echo "go vet ($$m)"; (cd $$m && $(GO) vet ./...) || exit 1; done

# staticcheck comes from the Go module proxy; when it cannot be installed the
# target says so and the rest of the run goes on.
staticcheck:
	@if [ ! -x $(BIN)/staticcheck ]; then GOBIN=$(BIN) $(GO) install $(STATICCHECK) || echo "staticcheck: could not install $(STATICCHECK); skipped"; fi
	@if [ -x $(BIN)/staticcheck ]; then for m in $(MODULES); do echo "staticcheck ($$m)"; (cd $$m && $(BIN)/staticcheck ./...) || exit 1; done; fi

test-unit:
	$(GO) test $(TESTFLAGS) ./...

# What reacts to assignment (drain on revoke, lost partitions, the Kafka
# scope's fencing and rewinds, the DB scope's stored offsets and parking,
# changelog restore), again under the consumer group protocol (KIP-848).
CONSUMER_PROTOCOL_TESTS = TestLostPartitionCommitsNothing|TestRevokeEndsRetryBackoff|TestRetryRungFilledDuringRollingDeployIsDrained|TestStopLogsTheDrain|TestFencing$$|TestRebalanceAbortsAndRewinds|TestIdleMemberSeesEveryRevocation|TestRestartFencesThePredecessorsOpenTransaction|TestVersionsRestoredOnceTheChangelogIsStable|TestLostPartitionsWhileTheAbortFailsKeepRunning|TestZombieAfterRebalanceHasOneEffect|TestStoredOffsetsResumeAheadOfKafka|TestDBReleasedHeadCutByLostPartitionIsRoutedAgain|TestDBParkedRedeliveryKeepsOrder|TestVersionGapAcrossRebalance

test-consumer-protocol:
	KSCOPE_GROUP_PROTOCOL=consumer $(GO) test $(TESTFLAGS) -run '$(CONSUMER_PROTOCOL_TESTS)' ./consumer ./txn ./dbscope

test-integration:
	cd integration && $(GO) test $(TESTFLAGS) ./...
	cd bench && $(GO) test $(TESTFLAGS) ./...

## reliability: the fault matrix, hostile input, security and soak suites in their long form; writes RELIABILITY.md
# make test runs their short form with the rest of the integration module.
reliability:
	cd integration && KSCOPE_RELIABILITY=long KSCOPE_RELIABILITY_REPORT=$(CURDIR)/RELIABILITY.md \
		$(GO) test -race -count=1 -timeout 60m -run '^TestReliability'

## test-kafka: the integration suites, the test kit, the library's Kafka tests, the demo and the short reliability matrix on Apache Kafka started from Maven Central (needs a JDK and Maven; the first run downloads the broker once); the last line is a JSON object
test-kafka:
	$(GO) run ./internal/testkafka -go $(GO)

## test-containers: the integration suites on real Apache Kafka and PostgreSQL (needs Docker)
test-containers:
	cd integration && KSCOPE_TEST_CONTAINERS=1 $(GO) test -count=1 -timeout 30m ./...

## bench: the quick run, then the full run with the quick ratios beside its own (writes BENCHMARKS.md and its chart), then the Go micro-benchmarks of the hot paths, with allocation counts
bench:
	cd bench && $(GO) run . -mode quick -out $${TMPDIR:-/tmp}/kscope-bench-quick.md -summary $${TMPDIR:-/tmp}/kscope-bench-quick.json
	cd bench && $(GO) run . -mode full -quick $${TMPDIR:-/tmp}/kscope-bench-quick.json
	$(GO) test -run '^$$' -bench . -benchmem ./...

## bench-quick: the benchmark ratios with smaller record counts, in 5 to 7 minutes (more where the broker's round trips are slow); the last line is a JSON object
bench-quick:
	cd bench && $(GO) run . -mode quick

fmt:
	gofmt -w $$(git ls-files '*.go')
