package kscopeprom

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
)

// DefaultDeadLetterInterval is how often WatchDeadLetters counts the dead
// letters waiting when its caller does not say.
const DefaultDeadLetterInterval = time.Minute

// deadLetterTimeout bounds one count's requests.
const deadLetterTimeout = 30 * time.Second

// WatchDeadLetters exports, until ctx is done, how many dead letters of
// cfg's consumer group wait for triage:
//
//	kscope_dead_letters_waiting{consumer_group,topic}
//
// topic is the group's dead-letter topic (cfg.Failures.DeadLetterTopic, by
// default <group>.kscope-dlt), and the value is the count of
// retrytopic.DeadLettersWaiting summed over its partitions: the offsets
// past those kscope dlt redrive committed under the group
// retrytopic.TriageGroup(group). A dead letter raises it; a redrive lowers
// it by the records it handled. In a topic written in transactions (the
// Kafka scope) each commit marker counts too, until a redrive passes it.
//
// It counts every interval (0: DefaultDeadLetterInterval), with a client
// of its own (cfg.Brokers and cfg.ClientOptions) and three requests to
// the brokers, whatever the size of the topic. It is off unless a service
// calls it: run it next to the runner, in one member of the group or in
// each (every member then reports the same count; aggregate with max, not
// sum). A count that fails is logged as a WARN on cfg.Logger and drops the
// series until the next one succeeds, so that a stale value is never
// shown. It returns nil when ctx is done, and an error at once for a
// cfg without Brokers or Group, or a negative interval.
func (m *Metrics) WatchDeadLetters(ctx context.Context, cfg consumer.Config, interval time.Duration) error {
	switch {
	case len(cfg.Brokers) == 0 || cfg.Group == "":
		return errors.New("kscopeprom: WatchDeadLetters needs the runner's Config, with its Brokers and Group")
	case interval < 0:
		return fmt.Errorf("kscopeprom: WatchDeadLetters' interval is %v; give a positive one, or 0 for %v", interval, DefaultDeadLetterInterval)
	case interval == 0:
		interval = DefaultDeadLetterInterval
	}
	cfg = cfg.WithDefaults()
	gauge, err := m.deadLettersWaiting()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, cfg.ClientOptions...), kgo.SeedBrokers(cfg.Brokers...))...)
	if err != nil {
		return fmt.Errorf("kscopeprom: creating the Kafka client of WatchDeadLetters: %w", err)
	}
	defer cl.Close()
	adm, dlt := kadm.NewClient(cl), cfg.Failures.DeadLetterTopic
	labels := prometheus.Labels{"consumer_group": cfg.Group, "topic": dlt}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, min(interval, deadLetterTimeout))
		waiting, err := retrytopic.DeadLettersWaiting(cctx, adm, cfg.Group, dlt)
		cancel()
		switch {
		case ctx.Err() != nil:
			gauge.Delete(labels)
			return nil
		case err != nil:
			gauge.Delete(labels)
			cfg.Logger.Warn("kscope: counting the dead letters waiting for triage failed; kscope_dead_letters_waiting is left out until a count succeeds",
				"group", cfg.Group, "dlt", dlt, "err", err)
		default:
			var n int64
			for _, w := range waiting {
				n += w
			}
			gauge.With(labels).Set(float64(n))
		}
		select {
		case <-ctx.Done():
			gauge.Delete(labels)
			return nil
		case <-tick.C:
		}
	}
}

// deadLettersWaiting returns kscope_dead_letters_waiting, registered at
// the first call.
func (m *Metrics) deadLettersWaiting() (*prometheus.GaugeVec, error) {
	m.waitingMu.Lock()
	defer m.waitingMu.Unlock()
	if m.waiting == nil {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_dead_letters_waiting",
			Help: "Dead letters waiting for triage: offsets of the dead-letter topic past those kscope dlt redrive committed under <group>.kscope-triage."},
			[]string{"consumer_group", "topic"})
		if err := m.reg.Register(g); err != nil {
			return nil, fmt.Errorf("kscopeprom: registering kscope_dead_letters_waiting: %w", err)
		}
		m.waiting = g
	}
	return m.waiting, nil
}
