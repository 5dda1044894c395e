"""basin.sim"""
