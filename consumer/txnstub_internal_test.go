package consumer

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/scope"
)

// txnStub implements scope.Transactor's transactional methods as no-ops,
// for tests of the runner's transactional paths (holding, dispatch bounds,
// rebalances) driven without a broker.
type txnStub struct{}

func (txnStub) TxnConfig() (string, time.Duration)                         { return "tx", 10 * time.Second }
func (txnStub) UseTxn(scope.TxnEngine[*Record]) error                      { return nil }
func (txnStub) TxnPrepare(context.Context) error                           { return nil }
func (txnStub) TxnPolled(context.Context, bool) error                      { return nil }
func (txnStub) TxnAbort(context.Context)                                   {}
func (txnStub) TxnAssigning(map[string][]int32)                            {}
func (txnStub) TxnGone(map[string][]int32, bool)                           {}
func (txnStub) TxnProgress()                                               {}
func (txnStub) TxnPollContext(p context.Context) (context.Context, func()) { return p, func() {} }
func (txnStub) TxnSkip(_ string, _ int32, recs []*kgo.Record) ([]*kgo.Record, []int64) {
	return recs, nil
}
