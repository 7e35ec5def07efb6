package testenv

import (
	"context"
	"sync"
	"testing"
)

// The Apache Kafka backend gives every test a one-node cluster of its own
// (StartKafka, KafkaT), and a JVM takes seconds of the machine to start.
// So that a test does not wait for its broker to start, the next test's
// broker starts while the test before it runs: StartKafka takes the spare
// started ahead, when there is one, and starts the next (in a test binary:
// a program gets one node, started when it asks). Each test still
// has a broker no other test used. StopShared stops the spare left at the
// end of the run.
var spare struct {
	mu   sync.Mutex
	next chan spareStart // nil: no spare started
	// started is closed once the last spare started has (or failed to).
	started chan struct{}
	wg      sync.WaitGroup
}

// spareStart is the outcome of a spare's start.
type spareStart struct {
	k   *Kafka
	err error
}

// startApacheOne returns a one-node Apache Kafka cluster: the spare when
// one was started ahead (or a new one when it failed to start), and starts
// the spare for the next call.
func startApacheOne(ctx context.Context) (*Kafka, error) {
	if !testing.Testing() {
		// A program (the benchmarks) starts its broker once: a spare
		// would only take its CPU.
		return StartApacheKafka(ctx, ApacheOptions{})
	}
	spare.mu.Lock()
	next := spare.next
	spare.next = nil
	spare.mu.Unlock()
	var k *Kafka
	if next != nil {
		if s := <-next; s.err == nil {
			k = s.k
		}
	}
	if k == nil {
		var err error
		if k, err = StartApacheKafka(ctx, ApacheOptions{}); err != nil {
			return nil, err
		}
	}
	startSpare()
	return k, nil
}

// startSpare starts the next spare, unless one is started already.
func startSpare() {
	spare.mu.Lock()
	defer spare.mu.Unlock()
	if spare.next != nil {
		return
	}
	next := make(chan spareStart, 1)
	started := make(chan struct{})
	spare.next, spare.started = next, started
	spare.wg.Add(1)
	go func() {
		defer spare.wg.Done()
		k, err := StartApacheKafka(context.Background(), ApacheOptions{})
		next <- spareStart{k, err}
		close(started)
	}()
}

// SpareStarted waits until the broker that the Apache Kafka backend starts
// ahead for the next test has started (or failed to), and returns at once
// on the other backends. A test that checks for leaked goroutines calls it
// before it notes the goroutines running: the spare's start creates
// goroutines of its own (its admin client's, its JVM's wait) while the
// test runs, which are not the test's.
func SpareStarted() {
	spare.mu.Lock()
	started := spare.started
	spare.mu.Unlock()
	if started != nil {
		<-started
	}
}

// stopSpare stops the spare, started or starting (the next StartKafka
// starts its own).
func stopSpare() {
	spare.mu.Lock()
	next := spare.next
	spare.next = nil
	spare.mu.Unlock()
	if next != nil {
		if s := <-next; s.k != nil {
			s.k.Close()
		}
	}
	spare.wg.Wait()
}
