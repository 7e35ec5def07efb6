package kscopetest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/kscopetest"
)

// An AtLeastOnce service hands its handler to the kit with the idempotency
// guard it runs in production (here a memory store; dedupe.NewPostgres or
// redisstore.New in a service that runs several instances), and a count of
// its effects in a fake of the service it calls.
func ExampleAtLeastOnce() {
	_ = func(t *testing.T) {
		mailer := &fakeMailer{} // the handler's downstream, in the test
		store := dedupe.NewMemory(0)
		report := kscopetest.AtLeastOnce(t, kscopetest.AtLeastOncePipeline{
			Handler: consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
				var order struct{ ID string }
				if err := json.Unmarshal(r.Value, &order); err != nil {
					return consumer.DecodeError(err)
				}
				return mailer.Send(ctx, order.ID)
			}),
			Config: func(c consumer.Config) consumer.Config {
				c.Dedupe = consumer.DedupeConfig{Store: store}
				return c
			},
			Valid: func(i int) *kgo.Record {
				return &kgo.Record{Value: fmt.Appendf(nil, `{"ID":"o-%d"}`, i)}
			},
			Undecodable: func() *kgo.Record { return &kgo.Record{Value: []byte("not json")} },
			Effects:     func(context.Context) (int, error) { return mailer.Sent(), nil },
		})
		for _, r := range report {
			t.Logf("%s held=%v skipped=%v %s", r.Scenario, r.Held, r.Skipped, r.Detail)
		}
	}
}

// fakeMailer counts the mails sent, one per call.
type fakeMailer struct{ sent atomic.Int64 }

func (m *fakeMailer) Send(context.Context, string) error { m.sent.Add(1); return nil }
func (m *fakeMailer) Sent() int                          { return int(m.sent.Load()) }
