package retrytopic_test

import (
	"context"
	"fmt"
	"log"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// How many of group payments' dead letters wait for triage, per partition
// of its dead-letter topic.
func ExampleDeadLettersWaiting() {
	cl, err := kgo.NewClient(kgo.SeedBrokers("localhost:9092"))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	waiting, err := retrytopic.DeadLettersWaiting(context.Background(), kadm.NewClient(cl), "payments", retrytopic.DLTopic("payments"))
	if err != nil {
		log.Fatal(err)
	}
	for p, n := range waiting {
		fmt.Printf("partition %d: %d waiting (past what %s committed)\n", p, n, retrytopic.TriageGroup("payments"))
	}
}

func ExampleTriageGroup() {
	fmt.Println(retrytopic.TriageGroup("payments"))
	// Output: payments.kscope-triage
}
