package consumer_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/kscope-dev/kscope/consumer"
)

// A share group of image resizers: every member takes jobs from the same
// partitions, a job whose handler runs for minutes keeps its lock, and a
// job that crashed four members is dead-lettered instead of tried again.
func ExampleShareConfig() {
	resize := func(ctx context.Context, rec *consumer.Record) error { return nil }
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "resizers", // a share group
		Topics:  []string{"images.uploaded"},
		Share: &consumer.ShareConfig{
			MaxDeliveries: 4,                // below the broker's group.share.delivery.count.limit
			RenewBefore:   10 * time.Second, // renew a running job's lock 10s before it expires
		},
		MaxInFlightRecords: 64, // a poll's records: small polls spread the jobs over more members
	}, consumer.HandlerFunc(resize))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Stats().Share.Accepted, r.Config().Failures.DisableRetryTopics)
	// Output: 0 true
}
