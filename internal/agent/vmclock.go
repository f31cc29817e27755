package agent

import (
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// VMClockSync keeps the guest's wall clock on the host's. A VM's clock
// stands still while QEMU has it stopped (pause, suspend); its RTC follows
// the host clock. Every second, at the RTC's update interrupt (the exact
// second boundary), the loop compares the RTC with the system clock and
// steps the clock when they differ by more than half a second, so a paused
// or woken guest sees the real time again within about a second.
func VMClockSync(log *slog.Logger) {
	go func() {
		for {
			err := clockSync("/dev/rtc0", log)
			log.Warn("vm clock sync stopped; retrying", "err", err)
			time.Sleep(10 * time.Second)
		}
	}()
}

func clockSync(dev string, log *slog.Logger) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.RTC_UIE_ON, 0); err != nil {
		return os.NewSyscallError("RTC_UIE_ON", err)
	}
	buf := make([]byte, 8)
	for {
		if _, err := unix.Read(fd, buf); err != nil {
			if err == unix.EINTR {
				continue
			}
			return os.NewSyscallError("read rtc", err)
		}
		now := time.Now()
		tm, err := unix.IoctlGetRTCTime(fd)
		if err != nil {
			return os.NewSyscallError("RTC_RD_TIME", err)
		}
		rtc := time.Date(int(tm.Year)+1900, time.Month(tm.Mon+1), int(tm.Mday), int(tm.Hour), int(tm.Min), int(tm.Sec), 0, time.UTC)
		off := rtc.Sub(now)
		if off > -500*time.Millisecond && off < 500*time.Millisecond {
			continue
		}
		tv := unix.NsecToTimeval(now.Add(off).UnixNano())
		if err := unix.Settimeofday(&tv); err != nil {
			return os.NewSyscallError("settimeofday", err)
		}
		log.Debug("vm clock stepped to the RTC", "offset", off)
	}
}
