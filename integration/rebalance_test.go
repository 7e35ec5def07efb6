package integration

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// member is one in-process group member.
type member struct {
	name string
	r    *consumer.Runner
	stop context.CancelFunc
	err  chan error
}

func startMember(t *testing.T, k *testenv.Kafka, name, group, topic string, h consumer.HandlerFunc) *member {
	t.Helper()
	r, err := consumer.New(consumer.Config{
		Brokers:        k.Brokers,
		Group:          group,
		Topics:         []string{topic},
		Shards:         6,
		CommitInterval: 50 * time.Millisecond,
		DrainTimeout:   10 * time.Second,
		// A short heartbeat makes members notice a rebalance quickly.
		ClientOptions: []kgo.Opt{kgo.ClientID(name), kgo.HeartbeatInterval(100 * time.Millisecond)},
		Logger:        slog.New(slog.DiscardHandler),
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{name: name, r: r, stop: cancel, err: make(chan error, 1)}
	go func() { m.err <- r.Run(ctx) }()
	t.Cleanup(func() { m.leave(t) })
	return m
}

func (m *member) leave(t *testing.T) {
	t.Helper()
	if m.stop == nil {
		return
	}
	m.stop()
	m.stop = nil
	select {
	case err := <-m.err:
		if err != nil {
			t.Errorf("member %s: %v", m.name, err)
		}
	case <-time.After(time.Minute):
		t.Errorf("member %s did not stop within a minute", m.name)
	}
}

// Members join and leave while records flow. At the end every record was
// handled at least once, no key was ever handled by two members at once (a
// revoked partition is drained before its next owner starts), per-key order
// held across owners (a new owner resumes at the last commit, never past
// it), and the committed offsets cover the topic.
func TestRebalanceWhileRecordsFlow(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, group, keys, perKey = "rebalance", "g-rebalance", 40, 80
	if err := k.CreateTopic(ctx, topic, 6); err != nil {
		t.Fatal(err)
	}
	obs := testenv.NewObserver()
	var ownersMu sync.Mutex
	owners := map[string]map[string]bool{} // key -> members that handled it
	handler := func(name string) consumer.HandlerFunc {
		return func(ctx context.Context, r *consumer.Record) error {
			leave := obs.Enter(r.Key)
			defer leave()
			time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
			obs.Record(r.Value)
			ownersMu.Lock()
			if owners[string(r.Key)] == nil {
				owners[string(r.Key)] = map[string]bool{}
			}
			owners[string(r.Key)][name] = true
			ownersMu.Unlock()
			return nil
		}
	}

	// The producer stays a few rounds ahead of the consumers, so records keep
	// flowing through every membership change.
	produced := make(chan error, 1)
	go func() {
		recs := testenv.KeyedRecords(topic, keys, perKey)
		for round := 0; round < perKey; round++ {
			for obs.Unique() < (round-4)*keys {
				time.Sleep(time.Millisecond)
			}
			if err := k.Produce(ctx, recs[round*keys:(round+1)*keys]...); err != nil {
				produced <- err
				return
			}
		}
		produced <- nil
	}()

	total := keys * perKey
	at := func(frac float64) func() bool {
		return func() bool { return obs.Unique() >= int(frac*float64(total)) }
	}
	// A joining member counts only once the group has handed it partitions
	// taken from the members already there (a cooperative rebalance).
	joined := func(m *member) func() bool {
		return func() bool { return m.r.Stats().Assigned > 0 }
	}
	a := startMember(t, k, "a", group, topic, handler("a"))
	testenv.WaitFor(t, time.Minute, "10% handled", at(0.10))
	b := startMember(t, k, "b", group, topic, handler("b"))
	testenv.WaitFor(t, time.Minute, "b to get partitions", joined(b))
	testenv.WaitFor(t, time.Minute, "25% handled", at(0.25))
	c := startMember(t, k, "c", group, topic, handler("c"))
	testenv.WaitFor(t, time.Minute, "c to get partitions", joined(c))
	testenv.WaitFor(t, time.Minute, "40% handled", at(0.40))
	a.leave(t)
	testenv.WaitFor(t, time.Minute, "55% handled", at(0.55))
	d := startMember(t, k, "d", group, topic, handler("d"))
	testenv.WaitFor(t, time.Minute, "d to get partitions", joined(d))
	testenv.WaitFor(t, time.Minute, "70% handled", at(0.70))
	b.leave(t)
	testenv.WaitFor(t, 2*time.Minute, "every record handled", at(1))
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "offsets committed to the end", func() bool { return k.CommittedAll(t, group, topic) })

	if n := obs.Overlaps(); n != 0 {
		t.Fatalf("%d times two members handled one key at once", n)
	}
	obs.CheckOrderWithReplays(t, keys, perKey)
	if revokes := b.r.Stats().Rebalances; revokes < 3 {
		t.Fatalf("member b saw %d rebalance callbacks, want at least its assignment, c's join and a's leave", revokes)
	}
	moved := 0
	for _, m := range owners {
		if len(m) > 1 {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no key ever changed owner: the test did not rebalance")
	}
	t.Logf("%d records, %d handlings, %d of %d keys changed owner", total, obs.Handled(), moved, keys)
}
