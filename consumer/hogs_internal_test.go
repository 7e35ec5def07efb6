package consumer

import "testing"

// TestHogs: backpressure pauses only a partition that takes the room from
// the others (more than one and a half times its share), never every partition that
// competes, and idle partitions do not dilute the share.
func TestHogs(t *testing.T) {
	for _, c := range []struct {
		name     string
		pending  []int
		paused   []bool
		capacity int64
		want     int
	}{
		{"an even load pauses nothing", []int{6800, 6500, 6300, 6200, 6100, 6000, 5900, 5600}, make([]bool, 8), 50_000, 0},
		{"a slow partition hogging the bound is paused", []int{60, 2, 1, 1}, make([]bool, 4), 64, 1},
		{"a hog is paused beside a partition with records waiting", []int{60, 0}, make([]bool, 2), 64, 1},
		{"a lone partition is not paused", []int{64}, []bool{false}, 64, 0},
		{"pausing the last fetching partition is not done", []int{60, 40}, []bool{false, true}, 64, 0},
		{"two hogs beside a fetching one", []int{40, 35, 1}, make([]bool, 3), 64, 2},
	} {
		if got, _ := hogs(c.pending, c.paused, c.capacity); got != c.want {
			t.Errorf("%s: hogs(%v, %v, %d) = %d, want %d", c.name, c.pending, c.paused, c.capacity, got, c.want)
		}
	}
}
