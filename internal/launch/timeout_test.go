package launch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/comm"
)

// TestInitTimeout: comm.init_timeout_seconds (comm.Options.InitTimeout)
// bounds the bootstrap: rank 0 of a world of 2 whose rank 1 never comes
// fails after about that long, not after the 10-minute default, with an
// error naming the timeout.
func TestInitTimeout(t *testing.T) {
	port := freePort(t)
	spec, err := Detect([]string{"MASTER_ADDR=127.0.0.1", fmt.Sprint("MASTER_PORT=", port), "WORLD_SIZE=2", "RANK=0"}, Flags{})
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 700 * time.Millisecond
	start := time.Now()
	w, err := JoinOptions(context.Background(), spec, comm.Options{InitTimeout: timeout})
	took := time.Since(start)
	if err == nil {
		w.Close(nil)
		t.Fatal("joined a world of 2 alone")
	}
	t.Logf("after %v: %v", took, err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
	}
	for _, want := range []string{"comm.init_timeout_seconds", timeout.String()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if took < timeout || took > timeout+20*time.Second {
		t.Errorf("gave up after %v, want about %v", took, timeout)
	}
}
