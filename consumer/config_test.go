package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

func TestBadConfigFailsAtConstruction(t *testing.T) {
	ok := func() consumer.Config {
		return consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}
	}
	nop := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	cases := []struct {
		name  string
		mod   func(*consumer.Config)
		field string
		says  string
	}{
		{"no brokers", func(c *consumer.Config) { c.Brokers = nil }, "Brokers", "set it to at least one host:port"},
		{"empty broker", func(c *consumer.Config) { c.Brokers = []string{" "} }, "Brokers", "empty address"},
		{"no group", func(c *consumer.Config) { c.Group = "" }, "Group", "set it to the group id"},
		{"no topics", func(c *consumer.Config) { c.Topics = nil }, "Topics", "set it to the topics to consume"},
		{"empty topic", func(c *consumer.Config) { c.Topics = []string{"a", ""} }, "Topics", "empty topic name"},
		{"duplicate topic", func(c *consumer.Config) { c.Topics = []string{"a", "a"} }, "Topics", `lists "a" twice`},
		{"negative shards", func(c *consumer.Config) { c.Shards = -1 }, "Shards", "between 1 and 4096"},
		{"too many shards", func(c *consumer.Config) { c.Shards = 5000 }, "Shards", "between 1 and 4096"},
		{"negative in-flight", func(c *consumer.Config) { c.MaxInFlightRecords = -5 }, "MaxInFlightRecords", "positive bound"},
		{"negative bytes", func(c *consumer.Config) { c.MaxInFlightBytes = -1 }, "MaxInFlightBytes", "positive bound"},
		{"negative drain", func(c *consumer.Config) { c.DrainTimeout = -time.Second }, "DrainTimeout", "positive duration"},
		{"drain past rebalance", func(c *consumer.Config) {
			c.DrainTimeout = 90 * time.Second
			c.RebalanceTimeout = 60 * time.Second
		}, "DrainTimeout", "must be shorter than RebalanceTimeout"},
		{"negative rebalance", func(c *consumer.Config) { c.RebalanceTimeout = -1 }, "RebalanceTimeout", "positive duration"},
		{"unknown group protocol", func(c *consumer.Config) { c.GroupProtocol = "eager" }, "GroupProtocol", "GroupProtocolClassic"},
		{"bad instance id", func(c *consumer.Config) { c.InstanceID = "orders 0" }, "InstanceID", "letters, digits"},
		{"long instance id", func(c *consumer.Config) { c.InstanceID = strings.Repeat("a", 250) }, "InstanceID", "at most 249"},
		{"share with the consumer protocol", func(c *consumer.Config) {
			c.Share = &consumer.ShareConfig{}
			c.GroupProtocol = consumer.GroupProtocolConsumer
		}, "GroupProtocol", "share group has its own protocol"},
		{"share with an instance id", func(c *consumer.Config) {
			c.Share = &consumer.ShareConfig{}
			c.InstanceID = "orders-0"
		}, "InstanceID", "share group has no static members"},
		{"negative commit interval", func(c *consumer.Config) { c.CommitInterval = -1 }, "CommitInterval", "positive duration"},
		{"unknown null-key policy", func(c *consumer.Config) { c.NullKeys = 9 }, "NullKeys", "NullKeyOrdered or NullKeySpread"},
		{"negative backoff", func(c *consumer.Config) { c.Failures.Backoff = -time.Second }, "Failures.Backoff", "set a positive duration"},
		{"max backoff below backoff", func(c *consumer.Config) {
			c.Failures.Backoff, c.Failures.MaxBackoff = time.Minute, time.Second
		}, "Failures.MaxBackoff", "raise it or lower Backoff"},
		{"negative retryable budget", func(c *consumer.Config) { c.Failures.RetryableAttempts = -1 }, "Failures.RetryableAttempts", "set it between 1 and 1000"},
		{"retryable budget past the cap", func(c *consumer.Config) { c.Failures.RetryableAttempts = 5000 }, "Failures.RetryableAttempts", "set it between 1 and 1000"},
		{"negative unknown budget", func(c *consumer.Config) { c.Failures.UnknownAttempts = -2 }, "Failures.UnknownAttempts", "set it between 1 and 1000"},
		{"negative in-place attempts", func(c *consumer.Config) { c.Failures.InPlaceAttempts = -1 }, "Failures.InPlaceAttempts", "set it to 1 or more"},
		{"non-positive ladder delay", func(c *consumer.Config) { c.Failures.Ladder = []time.Duration{0} }, "Failures.Ladder", "every delay must be positive"},
		{"sub-millisecond ladder delay", func(c *consumer.Config) { c.Failures.Ladder = []time.Duration{500 * time.Microsecond} }, "Failures.Ladder", "whole milliseconds"},
		{"ladder longer than a stage header counts", func(c *consumer.Config) {
			c.Failures.Ladder = nil
			for i := range 66 {
				c.Failures.Ladder = append(c.Failures.Ladder, time.Duration(i+1)*time.Second)
			}
		}, "Failures.Ladder", "at most 65"},
		{"decreasing ladder", func(c *consumer.Config) {
			c.Failures.Ladder = []time.Duration{time.Minute, 5 * time.Second}
		}, "Failures.Ladder", "delays must increase"},
		{"bad dead-letter topic", func(c *consumer.Config) { c.Failures.DeadLetterTopic = "a/b" }, "Failures.DeadLetterTopic", "use at most 249 of"},
		// A dead letter the runner consumes again is handled again, and
		// dead-lettered again, without end.
		{"dead-letter topic consumed", func(c *consumer.Config) {
			c.Topics = []string{"orders", "orders.dlt"}
			c.Failures.DeadLetterTopic = "orders.dlt"
		}, "Failures.DeadLetterTopic", "is one of Topics"},
		{"dead-letter topic named as a retry topic", func(c *consumer.Config) {
			c.Failures.DeadLetterTopic = "g.kscope-retry-30m"
		}, "Failures.DeadLetterTopic", "one of group g's retry topics"},
		{"client option rejected", func(c *consumer.Config) {
			c.ClientOptions = []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck())}
		}, "ClientOptions", "rejected by the Kafka client"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok()
			tc.mod(&cfg)
			r, err := consumer.New(cfg, nop)
			if err == nil {
				r.Close()
				t.Fatal("New accepted a bad config")
			}
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("error %q does not name field %s", err, tc.field)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q does not say %q", err, tc.says)
			}
		})
	}
	t.Run("nil handler", func(t *testing.T) {
		if _, err := consumer.New(ok(), nil); err == nil || !strings.Contains(err.Error(), "consumer.New's handler: is nil") || strings.Contains(err.Error(), "Config.Handler") {
			t.Fatalf("nil handler: %v", err)
		}
	})
	t.Run("every problem at once", func(t *testing.T) {
		_, err := consumer.New(consumer.Config{Shards: -1}, nop)
		for _, f := range []string{"Brokers", "Group", "Topics", "Shards"} {
			if err == nil || !strings.Contains(err.Error(), "Config."+f) {
				t.Fatalf("error %v does not list %s", err, f)
			}
		}
	})
	t.Run("defaults", func(t *testing.T) {
		r, err := consumer.New(ok(), nop)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		c := r.Config()
		if c.Shards != consumer.DefaultShards || c.MaxInFlightRecords != consumer.DefaultMaxInFlightRecords ||
			c.DrainTimeout != consumer.DefaultDrainTimeout || c.CommitInterval != consumer.DefaultCommitInterval ||
			c.Logger == nil || c.NullKeys != consumer.NullKeyOrdered {
			t.Fatalf("defaults not applied: %+v", c)
		}
	})
}
