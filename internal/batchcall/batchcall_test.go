package batchcall_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kscope-dev/kscope/internal/batchcall"
)

var errAt = errors.New("failed at")

// trace runs recs through Run with a batch call that answers by answer
// and returns what happened, call by call and record by record.
func trace(recs []int, turnedAway map[int]bool, answer func(call []int) error) (log []string, ok bool) {
	ok = batchcall.Run(recs, batchcall.Calls[int]{
		Admit: func(r int) error {
			if turnedAway[r] {
				return errors.New("filtered")
			}
			return nil
		},
		Batch: func(rs []int) error {
			log = append(log, fmt.Sprint("call ", rs))
			return answer(rs)
		},
		FailedAt: func(err error) (int, error, bool) {
			var f failed
			if errors.As(err, &f) {
				return f.i, errAt, true
			}
			return 0, nil, false
		},
		Each: func(r int, first batchcall.First) bool {
			switch {
			case !first.Ran:
				log = append(log, fmt.Sprint(r, " alone"))
			case first.Err != nil:
				log = append(log, fmt.Sprint(r, " failed"))
			default:
				log = append(log, fmt.Sprint(r, " ok"))
			}
			return r != 99
		},
	})
	return log, ok
}

type failed struct{ i int }

func (f failed) Error() string { return fmt.Sprint("failed at ", f.i) }

func TestRunOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		recs   []int
		away   map[int]bool
		answer func([]int) error
		want   []string
		ok     bool
	}{
		{"every record succeeds", []int{1, 2, 3}, nil, func([]int) error { return nil },
			[]string{"call [1 2 3]", "1 ok", "2 ok", "3 ok"}, true},
		{"failed at 1: the record before succeeds, the rest go again", []int{1, 2, 3}, nil, func(rs []int) error {
			if rs[0] == 1 {
				return failed{1}
			}
			return nil
		}, []string{"call [1 2 3]", "1 ok", "2 failed", "call [3]", "3 ok"}, true},
		{"a plain error isolates the batch", []int{1, 2}, nil, func([]int) error { return errors.New("boom") },
			[]string{"call [1 2]", "1 alone", "2 alone"}, true},
		{"an index outside the batch isolates it", []int{1, 2}, nil, func([]int) error { return failed{5} },
			[]string{"call [1 2]", "1 alone", "2 alone"}, true},
		{"a turned-away record goes alone, the others are batched around it", []int{1, 2, 3, 4}, map[int]bool{2: true}, func([]int) error { return nil },
			[]string{"call [1]", "1 ok", "2 alone", "call [3 4]", "3 ok", "4 ok"}, true},
		{"a record left undone stops the run", []int{1, 99, 3}, nil, func([]int) error { return nil },
			[]string{"call [1 99 3]", "1 ok", "99 ok"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := trace(tc.recs, tc.away, tc.answer)
			if !slices.Equal(got, tc.want) || ok != tc.ok {
				t.Fatalf("got %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
