package main

import "golang.org/x/sys/unix"

// fsTopDirFlag is FS_TOPDIR_FL of linux/fs.h (chattr +T).
const fsTopDirFlag = 0x00020000

// spreadStores marks root FS_TOPDIR_FL (see benchRoot); a filesystem that
// refuses the hint is left as it is.
func spreadStores(root string) {
	if fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		if flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS); err == nil {
			_ = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsTopDirFlag))
		}
		unix.Close(fd)
	}
}
