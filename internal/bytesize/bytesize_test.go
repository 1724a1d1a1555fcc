package bytesize

import "testing"

func TestHuman(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{3 << 19, "1.5 MiB"},
		{1<<30 - 1, "1024.0 MiB"},
		{82 << 30, "82.00 GiB"},
		{3 << 40, "3.00 TiB"},
	} {
		if got := Human(tc.n); got != tc.want {
			t.Errorf("Human(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
