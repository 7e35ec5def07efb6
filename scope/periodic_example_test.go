package scope_test

import (
	"context"
	"log"
	"sync"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/scope"
)

// sessions is a scope that keeps when each key was last seen, per
// partition, and forgets keys not seen for an hour: its periodic work,
// which the runner runs on each assigned partition every minute.
type sessions struct {
	mu   sync.Mutex
	seen map[int32]map[string]time.Time
}

var (
	_ scope.Scope[*consumer.Record] = (*sessions)(nil)
	_ scope.Periodic                = (*sessions)(nil)
)

func (s *sessions) Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range batch {
		if s.seen[r.Partition] == nil {
			s.seen[r.Partition] = map[string]time.Time{}
		}
		s.seen[r.Partition][string(r.Key)] = time.Now()
		done(r)
	}
}

// PeriodicInterval: every minute, for each assigned partition.
func (s *sessions) PeriodicInterval() time.Duration { return time.Minute }

// RunPeriodic forgets the partition's keys not seen for an hour.
func (s *sessions) RunPeriodic(ctx context.Context, topic string, partition int32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, at := range s.seen[partition] {
		if time.Since(at) > time.Hour {
			delete(s.seen[partition], key)
		}
	}
	return nil
}

// A scope with periodic work of its own implements scope.Periodic; the
// runner runs it for every assigned partition, on the partition's
// key-shard worker, and stops it with the partition's revoke.
func ExamplePeriodic() {
	r, err := consumer.NewScoped(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "sessions",
		Topics:  []string{"logins"},
	}, &sessions{seen: map[int32]map[string]time.Time{}})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
