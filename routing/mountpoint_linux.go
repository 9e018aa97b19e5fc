package routing

import "golang.org/x/sys/unix"

// isMountPoint reports whether path is the root of a mount of its own (a
// single-file bind mount), which a rename cannot replace (EBUSY). A
// missing file is none; a kernel that cannot tell (statx before Linux
// 5.8) says no, and the first admin change finds out.
func isMountPoint(path string) bool {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_BASIC_STATS, &st)
	if err != nil {
		return false
	}
	return st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}
